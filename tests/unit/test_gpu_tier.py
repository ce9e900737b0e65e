"""The GPU conformance tier's parts that need no GPU: its guard, its gate, its install-dir
choice, and how `make test-gpu` skips (one line, exit 0) or fails (NDI_GPU_REQUIRED=1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu import guard
from tests.gpu.node import absent_reason, choose_install_dir, norm_bus_id

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv", [
    ["rmmod", "nvidia"], ["/sbin/insmod", "x.ko"], ["modprobe", "-r", "nvidia"],
    ["/usr/sbin/modprobe", "nvidia"], ["kmod", "load"], ["depmod", "-a"],
    ["nvidia-smi", "-pm", "1"], ["nvidia-smi", "--persistence-mode=1"], ["nvidia-smi", "-mig", "1"],
    ["nvidia-smi", "-r"], ["nvidia-smi", "--gpu-reset"], ["nvidia-smi", "-ac", "1593,1410"],
    ["nvidia-smi", "-lgc", "1000"], ["nvidia-smi", "-pl", "300"], ["nvidia-smi", "-i", "0", "-e", "0"],
    ["nvidia-smi", "mig", "-cgi", "9"], ["nvidia-smi", "-c", "3"],
    ["nvidia-modprobe"], ["nvidia-modprobe", "-u"], ["nvidia-modprobe", "-c0", "-m"],
    ["nvidia-persistenced"], ["nvidia-ctk", "system", "create-dev-char-symlinks"],
    ["mount", "-t", "tmpfs", "none", "/dev"], ["ldconfig"],
    ["timeout", "60", "nvidia-smi", "-r"], ["setpriv", "--reuid", "65534", "rmmod", "nvidia"],
    ["unshare", "-m", "--", "modprobe", "-r", "nvidia"],
    ["sh", "-c", "lsmod; rmmod nvidia_uvm"], ["bash", "-c", "nvidia-smi -L && nvidia-smi -pm 1"],
    "echo x | modprobe -r nvidia",
])
def test_guard_refuses_what_would_change_the_node(argv):
    assert guard.refusal(argv, modeset=False)


@pytest.mark.parametrize("argv", [
    ["nvidia-smi", "--query-gpu=name,driver_version,pci.bus_id", "--format=csv,noheader"],
    ["nvidia-smi", "-L"], ["nvidia-smi", "-q", "-d", "FABRIC"], ["nvidia-smi", "-i", "0", "-q"],
    ["/usr/local/nvidia/bin/nvidia-modprobe", "-c255", "-c0"], ["nvidia-modprobe", "-c0", "-u"],
    ["nvidia-modprobe", "-c", "0", "-u"], ["ldconfig", "-p", "-C", "/etc/ld.so.cache"],
    ["lsmod"], ["modinfo", "nvidia"], ["kmod", "list"], ["setpriv", "--reuid", "65534", "nvidia-smi", "-L"],
    ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m", "x"],
])
def test_guard_lets_read_only_commands_run(argv):
    assert guard.refusal(argv, modeset=False) is None


def test_guard_allows_modeset_files_only_when_nvidia_modeset_is_loaded():
    argv = ["nvidia-modprobe", "-c255", "-c0", "-m"]
    assert guard.refusal(argv, modeset=True) is None
    assert "nvidia_modeset" in guard.refusal(argv, modeset=False)


def test_guard_hook_stops_commands_and_writes_before_they_happen(tmp_path):
    """In a child (audit hooks cannot be removed): the installer's own Runner is stopped too."""
    marker = tmp_path / "ran"
    code = f"""
import subprocess, sys
from tests.gpu import guard
guard.install()
from installer.host.runner import Runner
for what, call in (
    ("popen", lambda: subprocess.run(["rmmod", "nvidia"])),
    ("shell", lambda: subprocess.run("touch {marker}; modprobe -r nvidia", shell=True)),
    ("runner", lambda: Runner().run(["nvidia-smi", "-pm", "1"])),
    ("exec", lambda: __import__("os").execv("/sbin/rmmod", ["rmmod", "nvidia"])),
    ("write", lambda: open("/sys/module/nvidia/parameters/x", "w")),
    ("mount", lambda: subprocess.run(["mount", "-t", "tmpfs", "none", "/mnt"])),
):
    try:
        call()
        print(what, "RAN")
    except guard.Refused as exc:
        print(what, "refused:", exc)
subprocess.run(["true"])
print("read-only ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stderr
    assert [ln.split()[0] for ln in lines if "refused:" in ln] == [
        "popen", "shell", "runner", "exec", "write", "mount"], proc.stdout
    assert "RAN" not in proc.stdout and lines[-1] == "read-only ok"
    assert not marker.exists()


def _pci(sys_dir: Path, addr: str, *, vendor="0x10de", cls="0x030200", driver: str | None = "nvidia"):
    dev = sys_dir / "bus/pci/devices" / addr
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(vendor + "\n")
    (dev / "class").write_text(cls + "\n")
    (dev / "device").write_text("0x2330\n")
    if driver:
        (sys_dir / "bus/pci/drivers" / driver).mkdir(parents=True, exist_ok=True)
        (dev / "driver").symlink_to(sys_dir / "bus/pci/drivers" / driver)


def test_gate_says_why_in_one_line(tmp_path):
    smi = tmp_path / "nvidia-smi"
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    assert "no NVIDIA GPU: no PCI display controller" in absent_reason(tmp_path, smi)
    _pci(tmp_path, "0000:00:05.0", vendor="0x8086", cls="0x030000")  # another vendor's
    _pci(tmp_path, "0000:00:07.0", cls="0x068000", driver=None)  # an NVSwitch: not a GPU
    assert "no NVIDIA GPU: no PCI display controller" in absent_reason(tmp_path, smi)
    _pci(tmp_path, "0000:00:06.0", driver="vfio-pci")
    assert absent_reason(tmp_path, smi) == (
        "no NVIDIA GPU bound to the nvidia driver (0000:00:06.0 vfio-pci)")
    _pci(tmp_path, "0000:00:08.0")
    assert "no nvidia-smi" in absent_reason(tmp_path, None)
    assert absent_reason(tmp_path, smi) is None
    for reason in (absent_reason(tmp_path, None), absent_reason(tmp_path / "x", smi)):
        assert "\n" not in reason


def test_install_dir_choice(tmp_path):
    own, gke = tmp_path / "home/kubernetes/bin/nvidia", tmp_path / "usr/local/nvidia"
    (gke / "bin").mkdir(parents=True)
    smi = gke / "bin/nvidia-smi"
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    path = str(gke / "bin")
    assert choose_install_dir({"NDI_GPU_INSTALL_DIR": "/x"}, (own,), path)[0] == Path("/x")
    assert choose_install_dir({}, (own,), path)[0] == gke  # nvidia-smi's dir's parent
    own.mkdir(parents=True)
    assert choose_install_dir({}, (own,), path)[0] == gke  # no record: not ours to judge
    (own / ".cache").write_text("{}")
    assert choose_install_dir({}, (own,), path)[0] == own
    assert choose_install_dir({}, (), str(tmp_path))[0] is None


def test_bus_ids_of_nvidia_smi_and_sysfs_compare():
    assert norm_bus_id("00000000:00:06.0") == norm_bus_id("0000:00:06.0") == "0000:00:06.0"
    assert norm_bus_id("00000001:8A:00.0") == "0001:8a:00.0"


@pytest.mark.skipif(absent_reason(Path("/sys"), Path("/x")) is None,
                    reason="this machine has an NVIDIA GPU: make test-gpu would run the tier")
def test_make_test_gpu_without_a_gpu_skips_in_one_line_or_fails_when_required(tmp_path):
    env = {**os.environ, "NDI_GPU_REPORT_DIR": str(tmp_path)}
    env.pop("NDI_GPU_REQUIRED", None)
    argv = [sys.executable, "-m", "pytest", "tests/gpu", "-p", "no:cacheprovider", "-q"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    skipped = [ln for ln in proc.stdout.splitlines() if ln.startswith("SKIPPED")]
    assert len(skipped) == 1 and "GPU tier skipped: no NVIDIA GPU" in skipped[0], proc.stdout
    assert " skipped" in proc.stdout.splitlines()[-1] and "passed" not in proc.stdout
    assert "not run: no NVIDIA GPU" in (tmp_path / "gpu-conformance.txt").read_text()

    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**env, "NDI_GPU_REQUIRED": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [ln for ln in proc.stdout.splitlines() if "GPU tier FAILED" in ln]
    assert len(failed) == 1 and "NDI_GPU_REQUIRED=1 but no NVIDIA GPU" in failed[0], proc.stdout
