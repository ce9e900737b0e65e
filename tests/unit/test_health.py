"""The health sidecar's checks (installer/services/health.py) on fixture states, and its HTTP server.

Kernel log lines are shaped as real ones: the load banner and the FBHUB and persistence
lines from the real H100 node's transcript (tests/data/gpu-node),
Xid 79 as NVIDIA/open-gpu-kernel-modules issue 1151 quotes it (kernel_rc.c's format), Xid 63
as stas00/ml-engineering compute/accelerator/nvidia/debug.md quotes it, Xid 119 with the
``pid='N/A'`` field the 5xx drivers print.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from installer.base import podcontract
from installer.host.installdir import InstallDir
from installer.host.runner import Runner
from installer.kmod import xid
from installer.records import metrics
from installer.services import health
from installer.services import supervise as daemons
from installer.services.metrics_http import MetricsServer
from tests.fixtures.kernel import UBUNTU_KERNEL as RELEASE
from tests.fixtures.kernel import FakeKernel, fake_ko

V = "580.159.04"
BANNER = (f"NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  {V}  Release Build  "
          "(nixbld@)  ")
FBHUB = "NVRM: gpuClearFbhubPoisonIntrForBug2924523_GA100: FBHUB Interrupt detected. Clearing it."
XID79 = "NVRM: Xid (PCI:0000:00:04): 79, GPU has fallen off the bus."
XID63 = ("NVRM: Xid (PCI:0000:00:04): 63, pid=1896, Row Remapper: New row marked for "
         "remapping, reset gpu to activate.")
XID119 = "NVRM: Xid (PCI:0000:00:04): 119, pid='N/A', Timeout waiting for RPC from GSP!"
XID13 = "NVRM: Xid (PCI:0000:00:04): 13, Graphics Exception: ESR 0x404600=0x80000001"
LOG_USER = 1


def records(*lines: tuple[str, int]) -> list[xid.Record]:
    return [xid.Record(facility, 4, i, text) for i, (text, facility) in enumerate(lines)]


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A fake node with one GPU at 0000:00:04.0 and nvidia.ko loaded (its banner logged)."""
    kernel = FakeKernel(tmp_path / "kernel", RELEASE)
    kernel.activate(monkeypatch)
    kernel.add_gpu()
    kernel.preload(fake_ko("nvidia", RELEASE, version=V))
    install = InstallDir(tmp_path / "install", podcontract.INSTALL_DIR_HOST)
    install.root.mkdir()
    return kernel, install


def watcher(node) -> health.Watcher:
    from installer.kmod.kernel import KernelState

    kernel, install = node
    return health.Watcher(install, KernelState(), Runner())


# -- pure parts ---------------------------------------------------------------------------


def test_xid_classes_follow_the_catalog_and_count_since_the_load_banner():
    old = [(XID79, 0)]  # an earlier load's fault: no fault of the driver that runs now
    counts, problems = health.xid_findings(records(*old, (BANNER, 0), (FBHUB, 0),
                                                   (XID13, 0), (XID63, 0), (XID63, 0),
                                                   (XID119, 0)))
    assert counts == {("13", "app"): 1, ("63", "reset"): 2, ("119", "reset"): 1}
    assert problems == ["Xid 63 (PCI:0000:00:04): ECC row remapping or page retirement pending",
                        "Xid 119 (PCI:0000:00:04): GSP RPC timeout"]
    assert health.node_action(counts, problems) == "reset"


def test_xid_79_needs_a_reboot_and_a_users_copy_of_it_counts_for_nothing():
    counts, problems = health.xid_findings(records((BANNER, 0), (XID79, LOG_USER)))
    assert (counts, problems) == ({}, [])
    counts, problems = health.xid_findings(records((BANNER, 0), (XID79, 0)))
    assert counts == {("79", "reboot"): 1}
    assert health.node_action(counts, problems) == "reboot"


def test_the_kernel_quoting_a_user_is_no_xid():
    quoted = f"tmpfs: Unknown parameter '{XID79}'"
    assert health.xid_findings(records((BANNER, 0), (quoted, 0))) == ({}, [])


@pytest.mark.parametrize("address", ["0000:00:04.0", "00000000:00:04.0", "0000:00:04.0\n"])
def test_bus_ids_of_proc_and_nvidia_smi_are_one_spelling(address):
    assert health.bus_id(address) == "0000:00:04.0"


def test_a_gpu_gone_is_a_problem_and_one_added_is_not():
    assert health.gpu_findings(frozenset({"0000:00:05.0"}), frozenset({"0000:00:04.0"})) == [
        "GPU 0000:00:04.0 is gone from /proc/driver/nvidia/gpus"]
    assert health.gpu_findings(frozenset({"a", "b"}), frozenset({"a"})) == []


# -- on a fake node -------------------------------------------------------------------------


def test_a_healthy_node(node):
    kernel, install = node
    found = watcher(node).check()
    assert found.healthy and found.action == "none", found
    assert (found.driver_version, found.gpus_present, found.gpus_expected) == (V, 1, 1)
    assert found.xid_counts == {} and found.kernel_log == "ok"
    text = health.format_gauges(found)
    assert "nvidia_driver_installer_health_ok 1" in text
    assert 'nvidia_driver_installer_health_action{action="none"} 1' in text
    assert f'nvidia_driver_installer_health_driver_loaded{{driver_version="{V}"}} 1' in text


def test_xid_79_in_the_fake_kernel_log_makes_the_node_need_a_reboot(node):
    kernel, install = node
    w = watcher(node)
    assert w.check().healthy
    kernel.kernel_log(XID79, level=3)
    found = w.check()
    assert not found.healthy and found.action == "reboot"
    assert found.problems == ("Xid 79 (PCI:0000:00:04): GPU has fallen off the bus",)
    health.write_status(install.root, found)
    doc = health.read_status(install.root)
    assert doc["healthy"] is False and doc["action"] == "reboot"
    assert doc["xid_events"] == [{"code": "79", "action": "reboot", "count": 1}]


def test_a_gpu_that_vanishes_from_the_driver_is_named(node):
    kernel, install = node
    w = watcher(node)
    assert w.check().gpus_present == 1
    gpus = kernel.proc_dir / "driver/nvidia/gpus/0000:00:04.0"
    (gpus / "information").unlink()
    gpus.rmdir()
    found = w.check()
    assert found.problems == ("GPU 0000:00:04.0 is gone from /proc/driver/nvidia/gpus",)
    assert (found.action, found.gpus_expected, found.gpus_present) == ("check", 1, 0)


def test_gpus_the_install_verified_are_expected_from_the_first_check(node):
    kernel, install = node
    install.status_file.write_text(json.dumps({
        "outcome": "ok", "exit_code": 0, "driver_version": V,
        "gpus": [{"address": "00000000:00:04.0"}, {"address": "00000000:00:05.0"}]}))
    found = watcher(node).check()
    assert found.problems == ("GPU 0000:00:05.0 is gone from /proc/driver/nvidia/gpus",)


def test_a_dead_daemon_sidecar_is_a_problem(node):
    kernel, install = node
    daemons.write_state(install.root, daemons.PERSISTENCED, daemons.EXITED,
                        "nvidia-persistenced (pid 42) exited with status 1: failed")
    found = watcher(node).check()
    assert found.daemons == {"persistenced": "exited"}
    assert found.problems == ("the persistenced sidecar is not running: nvidia-persistenced "
                              "(pid 42) exited with status 1: failed",)
    assert 'nvidia_driver_installer_health_daemon_up{daemon="persistenced"} 0' in (
        health.format_gauges(found))


def test_a_silent_daemon_sidecar_is_a_problem(node):
    kernel, install = node
    daemons.write_state(install.root, daemons.FABRIC_MANAGER, daemons.RUNNING, "pid 7")
    later = time.time() + daemons.STALE_S + 5
    assert "stopped reporting" in watcher(node).check(now=later).problems[0]


def test_no_driver_loaded_is_a_problem(tmp_path, monkeypatch):
    kernel = FakeKernel(tmp_path / "kernel", RELEASE)
    kernel.activate(monkeypatch)
    install = InstallDir(tmp_path / "install", podcontract.INSTALL_DIR_HOST)
    found = watcher((kernel, install)).check()
    assert found.problems == ("the nvidia kernel module is not loaded",)
    assert "nvidia_driver_installer_health_driver_loaded{driver_version=\"\"} 0" in (
        health.format_gauges(found))


def test_a_staged_driver_is_shown_and_is_no_problem(node):
    from installer.records import cache
    from installer.records.cache import CacheKey, ModuleSource

    kernel, install = node
    install.next_boot_dir.mkdir()
    cache.write(install.next_boot_dir / ".cache",
                CacheKey("580.95.05", kernel_release=RELEASE, source=ModuleSource.COMPILED,
                         module_type="open"), install.next_boot_dir, "test")
    found = watcher(node).check()
    assert found.healthy and found.staged_version == "580.95.05"
    assert ('nvidia_driver_installer_health_staged_for_next_boot{driver_version="580.95.05"} 1'
            in health.format_gauges(found))
    assert health.read_status(install.root) is None  # written by watch(), not check()


def test_an_unreadable_kernel_log_is_said_not_guessed(node):
    kernel, install = node
    (kernel.dev_dir / "kmsg").unlink()
    found = watcher(node).check()
    assert found.kernel_log.endswith("kmsg cannot be read") and found.healthy
    assert "nvidia_driver_installer_health_kernel_log_readable 0" in health.format_gauges(found)


def test_watch_keeps_going_after_a_failing_check_and_writes_the_verdict(node, monkeypatch):
    kernel, install = node
    w = watcher(node)
    calls = []
    real = w.check

    def flaky(now=None):
        calls.append(now)
        if len(calls) == 1:
            raise OSError("a hiccup")
        return real(now)

    monkeypatch.setattr(w, "check", flaky)
    health.watch(w, 0.01, checks=2, sleep=lambda s: None)
    assert len(calls) == 2 and health.read_status(install.root)["healthy"] is True


def test_every_gauge_has_help_and_type_and_samples_parse():
    text = health.format_gauges(None)
    assert text.splitlines() == ["# HELP nvidia_driver_installer_health_checked 1 once the "
                                 "health sidecar has checked the node.",
                                 "# TYPE nvidia_driver_installer_health_checked gauge",
                                 "nvidia_driver_installer_health_checked 0"]
    assert metrics.label_value('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


# -- the HTTP server ------------------------------------------------------------------------


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_the_server_answers_metrics_healthz_and_404():
    state = {"ok": True}
    server = MetricsServer("127.0.0.1", 0, lambda: "x 1\n",
                           lambda: (state["ok"], "ok" if state["ok"] else "action reboot"))
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert get(base + "/metrics") == (200, "text/plain; version=0.0.4; charset=utf-8",
                                          "x 1\n")
        assert get(base + "/healthz")[::2] == (200, "ok\n")
        state["ok"] = False
        assert get(base + "/healthz")[::2] == (503, "action reboot\n")
        assert get(base + "/nope")[0] == 404
    finally:
        server.close()


def test_a_port_in_use_is_an_oserror_the_cli_names(tmp_path):
    server = MetricsServer("127.0.0.1", 0, lambda: "", lambda: (True, "ok")).start()
    try:
        with pytest.raises(OSError):
            MetricsServer("127.0.0.1", server.port, lambda: "", lambda: (True, "ok"))
    finally:
        server.close()


def test_no_gauge_name_is_left_out_of_the_docs():
    doc = (Path(__file__).parents[2] / "docs/health-and-metrics.md").read_text()
    for name in health_metric_names():
        assert f"`{name}`" in doc, name


def health_metric_names() -> list[str]:
    """Every metric name the sidecar serves: the install's and the health gauges."""
    from installer.records.outcome import Outcome

    text = metrics.format_metrics(Outcome("ok"), kernel_release="k") + health.format_gauges(
        health.Health(0.0, V, "x", 1, 1, {("79", "reboot"): 1}, {"persistenced": "running"}))
    return sorted({line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")})


def test_the_sidecar_on_a_port_in_use_exits_2_with_one_line(tmp_path, capsys, monkeypatch):
    from installer.cli import main

    busy = MetricsServer("127.0.0.1", 0, lambda: "", lambda: (True, "ok")).start()
    monkeypatch.setenv("LOG_FORMAT", "json")
    try:
        with pytest.raises(SystemExit) as exit_info:
            main(["sidecar", "health", "--install-dir", str(tmp_path), "--listen-address",
                  "127.0.0.1", "--port", str(busy.port)])
    finally:
        busy.close()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert f"cannot serve metrics on 127.0.0.1:{busy.port}: Address already in use" in err
    assert "Traceback" not in err


# -- the verdict in the readiness file (records/readiness.py) --------------------------------

INSTALL_LINES = "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_VERSION=580.159.04\nDAEMONS=ok\n"


def test_own_lines_are_replaced_and_every_other_line_kept_in_place():
    from installer.records import readiness

    first = readiness.with_own_lines(INSTALL_LINES, {"GPU_HEALTH": "ok", "GPU_HEALTH_REASON": ""})
    assert first == INSTALL_LINES + "GPU_HEALTH=ok\nGPU_HEALTH_REASON=\n"
    moved = first.replace("GPU_HEALTH=ok\n", "").replace("DAEMONS=ok\n",
                                                          "GPU_HEALTH=ok\nDAEMONS=ok\n")
    again = readiness.with_own_lines(moved, {"GPU_HEALTH": "reboot",
                                             "GPU_HEALTH_REASON": "Xid 79\nREADY=yes\x1b"})
    assert again == ("IS_HOST_DRIVER=true\nNVIDIA_DRIVER_VERSION=580.159.04\n"
                     "GPU_HEALTH=reboot\nGPU_HEALTH_REASON=Xid 79\\nREADY=yes\\x1b\n"
                     "DAEMONS=ok\n")
    assert readiness.parse(again)["GPU_HEALTH_REASON"] == "Xid 79\\nREADY=yes\\x1b"
    assert "READY" not in readiness.parse(again)  # the reason's newline made no line
    long = readiness.with_own_lines("A=1", {"GPU_HEALTH_REASON": "x" * 1000})
    assert long.startswith("A=1\nGPU_HEALTH_REASON=x") and long.endswith("...\n")
    assert len(long.splitlines()[1]) == len("GPU_HEALTH_REASON=") + readiness.REASON_MAX_CHARS


def ready_host(tmp_path, text: str | None):
    from installer.host.hostroot import HostRoot
    from installer.records import readiness

    (tmp_path / "host").mkdir()
    host = HostRoot(tmp_path / "host")
    if text is not None:
        host.write_atomic(readiness.READY_HOST_PATH, text, mode=0o640)
    return host, host.path(readiness.READY_HOST_PATH)


def test_the_verdict_is_written_once_keeping_the_file_and_its_mode(tmp_path):
    from installer.records import readiness

    host, path = ready_host(tmp_path, INSTALL_LINES)
    assert readiness.set_health(host, "reboot", "Xid 79 (PCI:0000:00:04): gone")
    assert path.read_text() == INSTALL_LINES + (
        "GPU_HEALTH=reboot\nGPU_HEALTH_REASON=Xid 79 (PCI:0000:00:04): gone\n")
    assert (path.stat().st_mode & 0o7777, path.stat().st_uid) == (0o640, os.getuid())
    inode = path.stat().st_ino
    assert not readiness.set_health(host, "reboot", "Xid 79 (PCI:0000:00:04): gone")
    assert path.stat().st_ino == inode  # unchanged verdict: no write
    assert sorted(p.name for p in path.parent.iterdir()) == ["driver-ready"]  # no temp left


def test_no_readiness_file_no_write(tmp_path):
    from installer.records import readiness

    host, path = ready_host(tmp_path, None)
    assert not readiness.set_health(host, "ok", "")
    assert not path.exists() and not path.parent.exists()
    path.parent.mkdir(parents=True)
    assert not readiness.set_health(host, "reboot", "Xid 79")
    assert list(path.parent.iterdir()) == []


def test_a_file_removed_before_the_swap_stays_removed(tmp_path, monkeypatch):
    """doctor or uninstall by hand removes driver-ready between the sidecar's read and its
    rename: the exchange fails (ENOENT) and nothing is left behind."""
    from installer.host import hostroot
    from installer.records import readiness

    host, path = ready_host(tmp_path, INSTALL_LINES)
    real = hostroot._exchange_if_same

    def removed_first(dir_fd, tmp, name, was):
        path.unlink()
        return real(dir_fd, tmp, name, was)

    monkeypatch.setattr(hostroot, "_exchange_if_same", removed_first)
    assert not readiness.set_health(host, "reboot", "Xid 79")
    assert list(path.parent.iterdir()) == []


def test_a_file_the_install_replaced_meanwhile_is_left_as_the_install_wrote_it(
        tmp_path, monkeypatch):
    from installer.host import hostroot
    from installer.records import readiness

    host, path = ready_host(tmp_path, INSTALL_LINES)
    real = hostroot._exchange_if_same
    newer = INSTALL_LINES.replace("580.159.04", "580.95.05")

    def install_wrote(dir_fd, tmp, name, was):
        host.write_atomic(readiness.READY_HOST_PATH, newer)
        return real(dir_fd, tmp, name, was)

    monkeypatch.setattr(hostroot, "_exchange_if_same", install_wrote)
    assert not readiness.set_health(host, "reboot", "Xid 79")
    assert path.read_text() == newer
    assert sorted(p.name for p in path.parent.iterdir()) == ["driver-ready"]


def test_watch_puts_the_verdict_in_the_readiness_file(node, tmp_path):
    kernel, install = node
    host, path = ready_host(tmp_path, INSTALL_LINES)
    w = health.Watcher(install, watcher(node).kernel, Runner(), host)
    health.watch(w, 0.01, checks=1, sleep=lambda s: None)
    assert path.read_text() == INSTALL_LINES + "GPU_HEALTH=ok\nGPU_HEALTH_REASON=\n"
    kernel.kernel_log(XID79, level=3)
    health.watch(w, 0.01, checks=1, sleep=lambda s: None)
    assert readiness_of(path)[-2:] == [
        "GPU_HEALTH=reboot",
        "GPU_HEALTH_REASON=Xid 79 (PCI:0000:00:04): GPU has fallen off the bus"]


def readiness_of(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_without_renameat2_it_checks_then_renames_and_still_never_recreates(
        tmp_path, monkeypatch):
    """Where the C library or the file system cannot exchange (fsutil.exchange False)."""
    from installer.host import hostroot
    from installer.records import readiness

    monkeypatch.setattr(hostroot, "exchange", lambda a, b, dir_fd: False)
    host, path = ready_host(tmp_path, INSTALL_LINES)
    assert readiness.set_health(host, "reset", "Xid 63")
    assert path.read_text() == INSTALL_LINES + "GPU_HEALTH=reset\nGPU_HEALTH_REASON=Xid 63\n"
    real = hostroot._exchange_if_same

    def removed_first(dir_fd, tmp, name, was):
        path.unlink()
        return real(dir_fd, tmp, name, was)

    monkeypatch.setattr(hostroot, "_exchange_if_same", removed_first)
    assert not readiness.set_health(host, "reboot", "Xid 79")
    assert list(path.parent.iterdir()) == []
