"""The harness tells a guest kernel that died before our code ran from a failing test.

No guest is booted here: the serial logs are shaped like the 6.12 guest's oops of
issue 43 (``Oops: int3`` in ``sched_clock_cpu`` from ``kernel_init_freeable``) and
like a run whose payload had started.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.vm import harness

BOOT_OOPS = """\
[    0.000000] Linux version 6.12.95+deb12-amd64
[    2.412345] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI
[    2.412400] CPU: 1 UID: 0 PID: 1 Comm: swapper/0 Not tainted 6.12.95+deb12-amd64 #1
[    2.412500] RIP: 0010:sched_clock_cpu+0x9/0x1a0
[    2.412600] Call Trace:
[    2.412700]  devtmpfs_create_node+0x5d/0xe0
[    2.412800]  misc_register+0x11a/0x1e0
[    2.412900]  cpu_latency_qos_init+0x1c/0x40
[    2.413000]  kernel_init_freeable+0x2fe/0x3a0
"""

PAYLOAD_STARTED = "[    1.0] Run /init as init process\r\nMARK stage1 kernel=6.12.95+deb12-amd64\r\n"


def test_an_oops_before_the_first_marker_is_the_guest_kernels_crash():
    crash = harness.crash_before_payload(BOOT_OOPS)
    assert crash is not None
    assert crash.splitlines()[0].endswith("Oops: int3: 0000 [#1] PREEMPT SMP NOPTI")
    assert "kernel_init_freeable" in crash


def test_an_oops_after_the_payload_started_is_the_tests_own():
    assert harness.crash_before_payload(PAYLOAD_STARTED + BOOT_OOPS) is None
    assert harness.crash_before_payload(PAYLOAD_STARTED) is None
    assert harness.crash_before_payload("[    9.9] Kernel panic - not syncing: VFS\n") is not None


def test_the_failure_message_says_the_kernel_crashed_before_the_test(tmp_path: Path):
    marks, steps = harness.parse_serial(BOOT_OOPS)
    result = harness.BootResult("r550-reboot", tmp_path / "serial.log", BOOT_OOPS, 9.0, -9,
                                False, steps, marks)
    assert result.failure().startswith("guest kernel crashed before the test ran")
    assert "sched_clock_cpu+0x9" in result.failure()
    ok = harness.BootResult("x", tmp_path / "s.log", PAYLOAD_STARTED, 9.0, None, True, {}, [])
    assert ok.failure().startswith("the guest did not finish boot 'x' (timed out: True")


def _fake_qemu(log: Path, text: str, then_sleep: float) -> subprocess.Popen:
    """A stand-in for qemu: writes ``text`` to the serial log, then lingers."""
    code = (f"import sys, time; open({str(log)!r}, 'w').write({text!r}); "
            f"sys.stdout.flush(); time.sleep({then_sleep})")
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def test_a_guest_whose_kernel_crashed_is_stopped_at_once_not_at_the_timeout(tmp_path: Path):
    log = tmp_path / "serial.log"
    t0 = time.monotonic()
    rc, timed_out = harness._wait(_fake_qemu(log, BOOT_OOPS, 120), log, timeout=100)
    assert not timed_out and rc != 0
    assert time.monotonic() - t0 < 20  # the grace period, never the 100 s bound


def test_a_guest_whose_payload_runs_is_left_to_its_timeout(tmp_path: Path):
    log = tmp_path / "serial.log"
    t0 = time.monotonic()
    rc, timed_out = harness._wait(_fake_qemu(log, PAYLOAD_STARTED + BOOT_OOPS, 120), log, timeout=6)
    assert timed_out
    assert time.monotonic() - t0 >= 6


def test_qemu_runs_single_threaded_tcg_by_default():
    if "NDI_VM_ACCEL" in os.environ:
        pytest.skip("NDI_VM_ACCEL overrides the default")
    assert harness.ACCEL == "tcg,thread=single"


def test_every_test_file_of_the_tier_has_its_place_in_the_run_order():
    """A file left out of TEST_ORDER would still run, but last, after the real builds it
    could have overlapped with (tests/vm/host_builds.py)."""
    from tests.vm import conftest

    files = sorted(p.name for p in Path(conftest.__file__).parent.glob("test_*.py"))
    assert sorted(conftest.TEST_ORDER) == files


class _Item:
    def __init__(self, *fixturenames: str, path: str = "tests/vm/test_x.py") -> None:
        self.fixturenames = list(fixturenames)
        self.path = Path(path)


class _Session:
    def __init__(self, *items: _Item) -> None:
        self.items = list(items)


def test_real_builds_start_once_and_only_for_the_tests_collected(monkeypatch):
    """host_builds.start_builds queues each build the collected tests need, once, in the
    order a session asks for them, before any guest is provisioned; a collected run
    without real-module tests builds none; the 6.12 guest's root waits for ``start``."""
    from tests.vm import host_builds

    calls: list[str] = []
    monkeypatch.setattr(host_builds, "_STARTED", {})
    monkeypatch.setattr(host_builds, "_download", lambda want_612, t: calls.append(f"dl {want_612}"))
    monkeypatch.setattr(host_builds, "_build_real_installs", lambda t: calls.append("real") or "R")
    monkeypatch.setattr(host_builds, "_build_r550", lambda t: calls.append("r550") or "N")
    monkeypatch.setattr(host_builds, "_guest_612", lambda a, t: "G")
    monkeypatch.setattr(host_builds, "_build_realparts",
                        lambda files, t: calls.append(f"realparts {sorted(files)}"))
    host_builds.start_builds(_Session(_Item("node")), {})
    host_builds.start(_Session(_Item("node")), None, {})
    assert host_builds._STARTED == {}
    session = _Session(_Item("node"), _Item("boot_real", "real_installs"), _Item("newer_kernel"),
                       _Item(path="tests/realparts/test_choice.py"),
                       _Item(path="tests/realparts/test_realparts.py"))
    host_builds.start_builds(session, {})
    host_builds.start_builds(session, {})
    host_builds._STARTED["realparts"].result()
    assert calls == ["dl True", "real", "r550", "realparts ['test_choice.py', 'test_realparts.py']"]
    assert "guest-612" not in host_builds._STARTED  # it needs the provisioned 6.1 guest
    host_builds.start(session, None, {})
    assert host_builds.real_installs({}).result() == "R"
    assert host_builds.r550({}).result() == "N"
    assert host_builds.guest_612(None, {}).result() == "G"
    assert len(calls) == 4  # nothing built twice
    # Only what the collected tests need: tests/realparts' option tests build nothing.
    monkeypatch.setattr(host_builds, "_STARTED", {})
    host_builds.start_builds(_Session(_Item(path="tests/realparts/test_choice.py")), {})
    assert host_builds._STARTED == {}
    host_builds.start_builds(_Session(_Item("newer_kernel")), {})
    host_builds._STARTED["r550"].result()
    assert set(host_builds._STARTED) == {"downloads", "r550"}
    assert calls[4:] == ["dl True", "r550"]


def test_early_builds_wait_for_the_provisioning_when_a_host_package_is_missing(monkeypatch):
    """The 535/470 builds start beside the 6.1 guest's provisioning: they install nothing
    on this machine while its apt-get may run (dpkg lock), and wait for it only then."""
    import contextlib

    from tests.realparts import kbuild
    from tests.realparts import provision as parts
    from tests.vm import host_builds

    calls: list[str] = []

    @contextlib.contextmanager
    def locked(path):
        calls.append(f"wait {path.name}")
        yield

    monkeypatch.setattr(host_builds.prov, "pick_abi", lambda apt, log: "6.1.0-56-amd64")
    monkeypatch.setattr(host_builds.prov, "locked", locked)
    monkeypatch.setattr(parts, "host_tools", lambda: calls.append("host_tools"))
    monkeypatch.setattr(kbuild, "installed_version", lambda pkg: "6.1.158-1")
    monkeypatch.setattr("shutil.which", lambda tool: f"/usr/bin/{tool}")
    host_builds._wait_for_host_packages()
    assert calls == []  # everything there (CI: make deps-tiers): no wait
    monkeypatch.setattr(kbuild, "installed_version", lambda pkg: None)
    host_builds._wait_for_host_packages()
    assert calls == ["wait .lock", "host_tools"]
    calls.clear()
    monkeypatch.setattr(kbuild, "installed_version", lambda pkg: "6.1.158-1")
    monkeypatch.setattr("shutil.which", lambda tool: None if tool == "pahole" else tool)
    host_builds._wait_for_host_packages()
    assert calls == ["wait .lock", "host_tools"]


def test_the_612_kernel_is_fetched_beside_the_builds_not_before_them(monkeypatch):
    from tests.vm import host_builds

    calls: list[str] = []
    monkeypatch.setattr(host_builds, "_STARTED", {})
    monkeypatch.setattr(host_builds, "_parts", lambda: calls.append("parts"))
    monkeypatch.setattr(host_builds, "_fetch_612", lambda t: calls.append("6.12"))
    host_builds._download(False, {})
    assert calls == ["parts"] and host_builds._STARTED == {}
    host_builds._download(True, {})
    host_builds._STARTED["kernel-612"].result()
    assert calls == ["parts", "parts", "6.12"]
