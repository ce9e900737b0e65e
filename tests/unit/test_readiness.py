"""driver-ready: cleared at the start of every install, written only after verification."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import pytest

from installer.base.errors import BuildError
from installer.commands import install
from installer.host.hostroot import HostRoot
from installer.kmod import diagnostics, kernel
from installer.plan import Plan, Step
from installer.records import metrics, readiness
from installer.records.outcome import Outcome
from installer.records.results import Verified
from installer.settings import Settings, validate
from tests.fixtures.kernel import UBUNTU_KERNEL

INSTALL_HOST = PurePosixPath("/home/kubernetes/bin/nvidia")


@pytest.fixture
def host(tmp_path, monkeypatch):
    root = tmp_path / "host"
    (root / "etc").mkdir(parents=True)
    (root / "etc/os-release").write_text('ID=ubuntu\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04"\n')
    (root / INSTALL_HOST.relative_to("/")).mkdir(parents=True)
    for name in ("proc", "sys", "dev"):
        (tmp_path / name).mkdir()
    kernel.use_roots(kernel.KernelRoots(tmp_path / "proc", tmp_path / "sys", tmp_path / "dev"))
    (tmp_path / "proc/modules").write_text("")
    return HostRoot(root)


def settings_for(host: HostRoot, **kw) -> Settings:
    return validate(Settings(host_root=host.root, kernel_release=UBUNTU_KERNEL, **kw))


def test_fields_round_trip(host):
    fields = readiness.ready_fields(
        readiness.ReadyDriver(driver_version="550.54.14", plan="fresh",
                              module_type="proprietary", gpu_count=2, persistence_mode="on"),
        install_dir_host=INSTALL_HOST, kernel_release="5.15.0", installer_version="0.1")
    path = readiness.write(host, fields)
    assert path == host.root / "run/nvidia/validations/driver-ready"
    got = readiness.read(host)
    assert got["IS_HOST_DRIVER"] == "true"
    assert got["NVIDIA_DRIVER_VERSION"] == "550.54.14"
    assert got["NVIDIA_LIB_DIR_HOST"] == "/home/kubernetes/bin/nvidia/lib64"
    assert got["GPU_COUNT"] == "2" and got["PERSISTENCE_MODE"] == "on"
    assert all("=" in line for line in path.read_text().splitlines())
    assert [p.name for p in path.parent.iterdir()] == ["driver-ready"]  # no temp file left


def test_multi_line_values_are_refused():
    with pytest.raises(ValueError):
        readiness.format_fields({"A": "x\ny"})


def test_clear_reports_whether_there_was_a_file(host):
    assert readiness.clear(host) is False
    readiness.write(host, {"A": 1})
    assert readiness.clear(host) is True
    assert readiness.read(host) is None


def test_metrics_text_format():
    text = metrics.format_metrics(Outcome("error", 7, duration_s=12.5, driver_version='5"50',
                                          plan="fresh", error_class="build"),
                                  kernel_release="5.15", finished_at=1700000000)
    assert "nvidia_driver_installer_success 0" in text
    assert "nvidia_driver_installer_exit_code 7" in text
    assert "nvidia_driver_installer_duration_seconds 12.500" in text
    assert 'driver_version="5\\"50"' in text and 'error_class="build"' in text
    assert "nvidia_driver_installer_last_run_timestamp_seconds 1700000000" in text
    assert 'nvidia_driver_installer_staged_for_next_boot{driver_version=""} 0' in text
    assert 'nvidia_driver_installer_cuda_check_deferred{detail=""} 0' in text
    assert text.count("# TYPE") == 7
    deferred = metrics.format_metrics(Outcome("ok", 0, cuda_check="deferred: MIG mode on GPU "
                                              "0000:00:04.0, no instances yet"),
                                      kernel_release="5.15")
    assert ('nvidia_driver_installer_cuda_check_deferred{detail="deferred: MIG mode on GPU '
            '0000:00:04.0, no instances yet"} 1') in deferred
    staged = metrics.format_metrics(Outcome("ok", 0, duration_s=1.0, driver_version="580.65.06",
                                            staged_driver_version="580.82.07", plan="staged"),
                                    kernel_release="5.15")
    assert 'nvidia_driver_installer_staged_for_next_boot{driver_version="580.82.07"} 1' in staged
    assert "nvidia_driver_installer_success 1" in staged
    # _info names the driver that runs, not the staged one (issue 34 §4).
    assert 'nvidia_driver_installer_info{driver_version="580.65.06",plan="staged"' in staged


def test_metrics_write_failure_is_not_fatal(host):
    (host.root / "var").write_text("a file where a directory should be")
    assert metrics.write_metrics(host, PurePosixPath("/var/lib/x.prom"), "x 1\n") is None


class FakeDistro:
    name = "fake"

    def __init__(self, steps, kind="fresh"):
        self.steps, self.kind = steps, kind

    def check_settings(self, ctx):
        pass

    def unpinned_artifacts(self, settings):
        return None

    def plan(self, ctx):
        return Plan(self.kind, tuple(self.steps), driver_version="550.54.14",
                    kernel_module_type="proprietary")


def run_with(monkeypatch, host, steps, kind="fresh", **kw):
    monkeypatch.setattr(install.flows, "for_host", lambda info: FakeDistro(steps, kind))
    return install.run(settings_for(host, **kw))


def test_readiness_absent_during_the_run_and_written_after_verify(host, monkeypatch):
    readiness.write(host, {"NVIDIA_DRIVER_VERSION": "535.183.01"})  # the previous run's
    seen = []

    def look(ctx):
        seen.append(readiness.read(ctx.host))

    def verified(ctx):
        return Verified((), {})

    run_with(monkeypatch, host, [Step("look", look), Step("verify", verified)])
    assert seen == [None]
    got = readiness.read(host)
    assert got["NVIDIA_DRIVER_VERSION"] == "550.54.14"
    assert got["INSTALL_PLAN"] == "fresh" and got["NVIDIA_KERNEL_MODULE_TYPE"] == "proprietary"


def test_failed_run_leaves_no_readiness_and_records_failure(host, monkeypatch):
    # A file naming a driver that is not loaded: the failed run does not put it back
    # (rollback.undo; tests/integration/test_rollback.py: back when it is loaded).
    readiness.write(host, {"NVIDIA_DRIVER_VERSION": "535.183.01"})

    def fail(ctx):
        raise BuildError("nvidia-installer failed (exit 1)")

    with pytest.raises(BuildError) as err:
        run_with(monkeypatch, host, [Step("build_driver", fail)],
                 metrics_file=PurePosixPath("/var/lib/node_exporter/nvidia.prom"))
    assert readiness.read(host) is None
    assert "kernel_log_tail" in err.value.context  # build failures carry the kernel log
    status = json.loads((host.root / INSTALL_HOST.relative_to("/") / "status.json").read_text())
    assert status["outcome"] == "error" and status["error_class"] == "build"
    assert status["context"]["step"] == "build_driver"
    metrics = (host.root / "var/lib/node_exporter/nvidia.prom").read_text()
    assert "nvidia_driver_installer_success 0" in metrics
    assert "nvidia_driver_installer_exit_code 7" in metrics


def test_run_without_verification_writes_no_readiness(host, monkeypatch):
    run_with(monkeypatch, host, [Step("preload_finished", lambda ctx: None)], kind="preload")
    assert readiness.read(host) is None


def test_installer_log_tail_only_from_this_run(host, monkeypatch, tmp_path):
    install_dir = host.root / INSTALL_HOST.relative_to("/")
    old = install_dir / "nvidia-installer.log"
    old.write_text("an old successful install\n")
    import os
    os.utime(old, (1, 1))

    def fail(ctx):
        (install_dir / "nvidia-installer.failed.log").write_text(
            "".join(f"line {i}\n" for i in range(40)) + "ERROR: Unable to build the module\n")
        raise BuildError("nvidia-installer failed (exit 1)")

    with pytest.raises(BuildError) as err:
        run_with(monkeypatch, host, [Step("build_driver", fail)])
    tail = err.value.context["installer_log_tail"]
    assert tail[0] == "(nvidia-installer.failed.log)"
    assert tail[-1] == "ERROR: Unable to build the module" and len(tail) == 21
    assert "an old successful install" not in tail


def test_download_failure_has_no_stale_installer_log(host, monkeypatch):
    from installer.base.errors import DownloadError

    (host.root / INSTALL_HOST.relative_to("/") / "nvidia-installer.log").write_text("old\n")
    import os
    os.utime(host.root / INSTALL_HOST.relative_to("/") / "nvidia-installer.log", (1, 1))

    def fail(ctx):
        raise DownloadError("HTTP 404")

    with pytest.raises(DownloadError) as err:
        run_with(monkeypatch, host, [Step("download_driver", fail)])
    assert "installer_log_tail" not in err.value.context
    assert "kernel_log_tail" not in err.value.context


def _dmesg_node(monkeypatch, tmp_path, script: str):
    """A kernel whose /dev has no kmsg and counts as the running kernel's (so the reader
    falls back to dmesg), with ``script`` as dmesg."""
    from installer.host.runner import Runner
    from installer.kmod.kernel import KernelState

    bin_dir, dev = tmp_path / "bin", tmp_path / "dev"
    bin_dir.mkdir()
    dev.mkdir()
    (bin_dir / "dmesg").write_text("#!/bin/sh\n" + script)
    (bin_dir / "dmesg").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:/bin")
    monkeypatch.setattr(diagnostics, "RUNNING_KERNEL_DEV", dev)
    return KernelState(tmp_path / "proc", tmp_path / "sys", dev), Runner()


def test_kernel_log_tail_when_dmesg_is_unreadable(monkeypatch, tmp_path):
    kernel, runner = _dmesg_node(monkeypatch, tmp_path, "echo 'dmesg: read kernel buffer "
                                 "failed: Operation not permitted' >&2\nexit 1\n")
    assert diagnostics.kernel_log_tail(kernel, runner) == [
        "(kernel log not readable: dmesg: read kernel buffer failed: Operation not permitted)"]


def test_kernel_log_tail_through_dmesg_keeps_the_kernels_own_records(monkeypatch, tmp_path):
    """``dmesg --raw``'s ``<prio>`` is facility << 3 | level (util-linux dmesg.c,
    LOG_RAW_FAC_PRI): <14> is a user's write to /dev/kmsg (facility 1), never the driver."""
    kernel, runner = _dmesg_node(monkeypatch, tmp_path, """cat <<'EOF'
<4>[   12.000001] NVRM: API mismatch: the client has the version 550.54.14
<14>[   12.000002] NVRM: Xid (PCI:0000:00:04): 79, forged by a user
<6>[   13.500000] eth0: link up
EOF
""")
    assert diagnostics.kernel_log_tail(kernel, runner) == [
        "[   12.000001] NVRM: API mismatch: the client has the version 550.54.14"]


def test_a_fake_node_without_kmsg_never_reads_the_machines_kernel_log(tmp_path):
    """dmesg reads the kernel this process runs on: for any other roots (a test's node) the
    log is unreadable, never the machine's."""
    from installer.host.runner import Runner
    from installer.kmod.kernel import KernelState

    kernel = KernelState(tmp_path / "proc", tmp_path / "sys", tmp_path / "dev")
    assert diagnostics.kernel_log_tail(kernel, Runner()) == [
        f"(kernel log not readable: {tmp_path / 'dev/kmsg'} cannot be read)"]


def _kernel_log_tail(tmp_path, *records: str) -> list[str]:
    """diagnostics.kernel_log_tail of a kernel whose /dev/kmsg holds ``records``."""
    from installer.host.runner import Runner
    from installer.kmod.kernel import KernelState

    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_text("".join(f"{r}\n" for r in records))
    kernel = KernelState(tmp_path / "proc", tmp_path / "sys", tmp_path / "dev")
    return diagnostics.kernel_log_tail(kernel, Runner())


def test_kernel_log_tail_keeps_relevant_lines(tmp_path):
    assert _kernel_log_tail(
        tmp_path, "6,0,1000000,-;eth0: link up",
        "4,1,2000000,-;NVRM: API mismatch: the client has the version 550.54.14",
        "12,2,2500000,-;nvidia: a user's line, facility 1",
        "3,3,3000000,-;Loading of unsigned module is rejected",
        "6,4,4000000,-;usb 1-1: new device",
        "5,5,5000000,-;Lockdown: insmod: unsigned module loading is restricted; see man "
        "kernel_lockdown.7",
        "3,6,6000000,-;tmpfs: Unknown parameter 'nvidia module signature'") == [
        "[    2.000000] NVRM: API mismatch: the client has the version 550.54.14",
        "[    3.000000] Loading of unsigned module is rejected",
        "[    5.000000] Lockdown: insmod: unsigned module loading is restricted; see man "
        "kernel_lockdown.7"]


def test_kernel_log_tail_never_shows_unrelated_lines(tmp_path):
    assert _kernel_log_tail(tmp_path, "6,0,1,-;eth0: link up", "6,1,2,-;usb 1-1: new device") == [
        "(no NVIDIA or kernel module lines in the kernel log)"]


def test_unwritable_readiness_is_a_verify_failure(host, monkeypatch):
    from installer.base.errors import VerifyError

    (host.root / "run/nvidia").mkdir(parents=True)
    (host.root / "run/nvidia/validations").write_text("a file, not a directory")

    def verified(ctx):
        return Verified((), {})

    with pytest.raises(VerifyError, match="readiness file could not be written"):
        run_with(monkeypatch, host, [Step("verify", verified)])
    status = json.loads((host.root / INSTALL_HOST.relative_to("/") / "status.json").read_text())
    assert status["outcome"] == "error" and status["exit_code"] == 9


def test_a_readiness_check_is_one_function_and_one_registration(host, monkeypatch):
    """verify.CHECKS is the one list: a check added there runs in the verify, in order, sees
    the results before it, and its result is a driver-ready line (status.json's cuda_check
    says "not run" when CUDA_CHECK is not among them)."""
    from installer.services import verify

    def ecc(ctx, lib_dir, done):
        return f"clean after {','.join(done)}"

    monkeypatch.setattr(verify, "CHECKS", (
        verify.ReadinessCheck("FIRST", "-", lambda ctx, lib_dir, done: "ok"),
        verify.ReadinessCheck("ECC_CHECK", "not run", ecc)))

    def verified(ctx):
        return Verified((), verify.workloads_ready(ctx))

    outcome = run_with(monkeypatch, host, [Step("verify", verified)])
    got = readiness.read(host)
    assert got["ECC_CHECK"] == "clean after FIRST" and got["FIRST"] == "ok"
    assert "CUDA_CHECK" not in got and outcome.cuda_check is None


def test_the_checks_report_their_unchecked_line_until_they_run():
    from installer.services import verify

    assert [c.key for c in verify.CHECKS] == ["NVLINK_FABRIC", "CUDA_CHECK", "DAEMONS"]
    assert verify.check_results({}) == {"NVLINK_FABRIC": "not checked",
                                        "CUDA_CHECK": "not run", "DAEMONS": ""}
    assert verify.check_results({"CUDA_CHECK": "passed"})["CUDA_CHECK"] == "passed"
