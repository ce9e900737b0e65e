"""Issue 43, hermetic default tests: no test reads the machine's node state for its node's.

The CI machine has no GPU; a GPU runner has ``/dev/nvidia*``, ``/proc/driver/nvidia``,
``/sys/module/nvidia`` and nvidia in ``/proc/modules``. A test whose installer reads those
instead of its fixture node's passes on one and fails on the other. The kernel-log tripwire
(tests/fixtures/kernelhook/kernellog_tripwire.py) refuses such reads by installer code; these
tests prove it does, and that a GPU runner's state cannot reach an install on a fixture node.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from installer.kmod.kernel import KernelState
from tests.fixtures.kernel import UBUNTU_KERNEL
from tests.pod import Pod, events, pod_on

REPO = Path(__file__).resolve().parents[2]
NVIDIA_LINE = "nvidia 56147968 0 - Live 0x0000000000000000 (POE)\n"  # a loaded 580 driver


def _tripwire():
    """The module the session armed (tests/fixtures/pytest_plugin.py)."""
    import kernellog_tripwire

    return kernellog_tripwire


def test_installer_code_cannot_read_the_machines_proc_modules():
    """A test that forgot its fake kernel: KernelState's default root is the machine's /proc."""
    tripwire = _tripwire()
    assert os.environ.get(tripwire.MACHINE_ENV) == "/", "the machine-state tripwire is not armed"
    with tripwire.expect(), pytest.raises(tripwire.RealMachineRead) as err:
        KernelState().modules()
    assert str(err.value).startswith("read the machine's /proc/modules, not the test node's")


def test_the_list_is_read_under_the_machine_root_it_is_given(tmp_path, monkeypatch):
    """Pointed at a tmp dir standing in for the machine's root (an nvidia line in its
    modules), the tripwire refuses installer reads there, and only of the node state."""
    tripwire = _tripwire()
    machine = tmp_path / "machine"
    (machine / "proc").mkdir(parents=True)
    (machine / "proc/modules").write_text(NVIDIA_LINE)
    (machine / "proc/cpuinfo").write_text("processor : 0\n")
    monkeypatch.setenv(tripwire.MACHINE_ENV, str(machine))
    with tripwire.expect(), pytest.raises(tripwire.RealMachineRead, match="proc/modules"):
        KernelState(proc_dir=machine / "proc").modules()
    assert (machine / "proc/cpuinfo").read_text()  # not node state; and not installer code:
    assert (machine / "proc/modules").read_text() == NVIDIA_LINE  # the harness may look


@pytest.mark.real_machine("proves the one allowance: a marked test's installer may read "
                          "the machine's own state, and still never its kernel log")
def test_the_real_machine_marker_allows_node_state_but_not_the_kernel_log():
    from installer.kmod import xid

    tripwire = _tripwire()
    assert tripwire.MACHINE_ENV not in os.environ  # nor in what this test starts
    KernelState().modules()  # the machine's /proc/modules (absent without module support)
    with tripwire.expect(), pytest.raises(tripwire.RealKernelLogRead):
        xid.read_kmsg(Path("/dev/kmsg"))


LEAKY_TESTS = '''
from installer.kmod.kernel import KernelState


def test_forgets_its_fake_kernel():
    assert "nvidia" not in KernelState().modules()


def test_swallows_what_the_installer_raised():
    try:
        KernelState().modules()
    except Exception:
        pass
'''


def test_a_session_whose_test_reads_the_real_proc_modules_fails_naming_it(tmp_path):
    """A test of its own pytest session reads the machine's /proc/modules through installer
    code: it fails, and the session fails too (even where the test swallowed the error),
    naming each test and the path."""
    (tmp_path / "test_leaky.py").write_text(LEAKY_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NDI_", "PYTEST_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path / "test_leaky.py"), "-q", "-p",
         "no:cacheprovider", "-p", "tests.fixtures.pytest_plugin", "--rootdir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "1 failed, 1 passed" in out, out[-3000:]
    assert "RealMachineRead: read the machine's /proc/modules" in out, out[-3000:]
    noted = out[out.index("not their fixture node's (issue 43):"):]
    for test in ("test_forgets_its_fake_kernel", "test_swallows_what_the_installer_raised"):
        assert (f"in test_leaky.py::{test} (call): read the machine's /proc/modules, not the "
                "test node's") in noted, noted


# --- a GPU runner's state, under the pod's mounts ---------------------------------------

def _gpu_machine(root: Path) -> Path:
    """What a GPU runner shows at /proc, /sys, /dev, /lib/modules, /run, /etc: a loaded 580
    driver (tests/data/gpu-node's forms), its devices, an NVRM line in its kernel log."""
    files = {
        "proc/modules": NVIDIA_LINE,
        "proc/driver/nvidia/version": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64"
                                      "  580.159.04  Release Build\n",
        "proc/driver/nvidia/params": "ModifyDeviceFiles: 0\n",
        "sys/module/nvidia/version": "580.159.04\n",
        "sys/module/nvidia/initstate": "live\n",
        "sys/module/nvidia/refcnt": "7\n",
        "dev/kmsg": "4,1,1000,-;NVRM: Xid (PCI:0000:00:04): 79, GPU has fallen off the bus.\n",
        f"lib/modules/{UBUNTU_KERNEL}/updates/dkms/nvidia.ko": "",
        "run/nvidia/validations/driver-ready": "IS_HOST_DRIVER=true\n",
        "etc/os-release": 'ID=cos\nVERSION_ID="113"\nBUILD_ID=18244.85.49\n',
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


class GpuRunnerPod(Pod):
    """A pod whose container sees ``machine``'s GPU state at /proc, /sys, /dev, /lib/modules,
    /run/nvidia and /etc/os-release, as on a GPU runner (only in the pod's mount namespace)."""

    machine: Path

    def _script(self, cli, env, *args, **kwargs) -> str:
        script = super()._script(cli, env, *args, **kwargs)
        r, m = self.scratch / "rootfs", self.machine
        devices = " ".join(("null", "zero", "full", "random", "urandom", "tty"))
        mounts = "\n".join([
            # Only over a /proc/modules that exists: procfs makes no new file (this CI
            # machine's kernel has no module support, so no /proc/modules at all).
            f"if [ -e {r}/proc/modules ]; then mount --bind {m}/proc/modules {r}/proc/modules; fi",
            f"mount --bind {m}/proc/driver {r}/proc/driver",
            f"mount --bind {m}/sys/module {r}/sys/module",
            f"mount -t tmpfs tmpfs {r}/dev",
            f"for d in {devices}; do touch {r}/dev/$d; mount --bind /dev/$d {r}/dev/$d; done",
            f"mkdir {r}/dev/shm {r}/dev/pts && mount --bind /dev/shm {r}/dev/shm",
            f"ln -s /proc/self/fd {r}/dev/fd && cp {m}/dev/kmsg {r}/dev/kmsg",
            f"mknod {r}/dev/nvidiactl c 195 255 && mknod {r}/dev/nvidia0 c 195 0",
            f"for d in lib/modules run/nvidia; do mkdir -p {r}/$d; mount --bind {m}/$d {r}/$d; done",
            f"mount --bind {m}/etc/os-release {r}/etc/os-release",
        ])
        marker = f"cd {self.scratch / 'rootfs'} && pivot_root"
        assert marker in script
        return script.replace(marker, mounts + "\n" + marker, 1)


def _outputs(pod: Pod, note: Path) -> dict[str, object]:
    env = {"NDI_KERNEL_LOG_TRIPWIRE": str(note)}
    out: dict[str, object] = {}
    for args in (("detect", "-o", "json"), ("install", "--dry-run")):
        proc = pod.run(*args, env=env)
        finals = [e for e in events(proc.stderr) if "event" in e][-1:]
        final = {k: v for e in finals for k, v in e.items() if k not in ("timestamp", "duration_s")}
        out[args[0]] = (proc.returncode, proc.stdout, final)
    return out


@pytest.mark.chroot
def test_a_gpu_runners_state_does_not_reach_an_install_on_a_fixture_node(
        node, kernel, server, tmp_path):
    """detect and install --dry-run on the fixture node (an L4, nothing loaded) say the same in
    a pod that sees a GPU runner's /proc, /sys, /dev as in one that sees this machine's, and
    the tripwire in the pod notes no read of them."""
    env = {"NVIDIA_DRIVER_VERSION": "550.54.14"}
    plain = pod_on(node, kernel, server, tmp_path / "pod", env=env)
    gpu = pod_on(node, kernel, server, tmp_path / "gpu-pod", env=env, pod_class=GpuRunnerPod)
    gpu.machine = _gpu_machine(tmp_path / "machine")
    note = tmp_path / "tripwire" / "reads"
    note.parent.mkdir()
    shown = [("/proc/driver/nvidia/version", "580.159.04"), ("/sys/module/nvidia/version", "580"),
             ("/etc/os-release", "ID=cos")]
    if Path("/proc/modules").exists():
        shown.append(("/proc/modules", "nvidia"))
    for path, text in shown:
        seen = gpu.run("-e", path, module="base64")  # what the pod's own python sees there
        assert text in base64.b64decode(seen.stdout).decode(), (path, seen.stderr[-2000:])
    no_driver = gpu.run("-e", "/dev/nvidia0", module="base64")  # a char device, no driver here
    assert "No such device or address: '/dev/nvidia0'" in no_driver.stderr, no_driver.stderr
    expected = _outputs(plain, note)
    assert expected["detect"][0] == 0 and expected["install"][0] == 0, expected
    detected = json.loads(expected["detect"][1])
    assert detected["loaded_driver_version"] is None, detected
    assert detected["os_id"] == "ubuntu", detected
    got = _outputs(gpu, note)
    for command in expected:  # one at a time: a difference shows in full
        assert got[command] == expected[command], command
    assert not note.exists() or note.read_text() == ""
