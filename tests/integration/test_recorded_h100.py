"""The read-only commands on a real GPU node, rebuilt from its recording (issue 30).

tests/fixtures/recorded_node.py rebuilds the H100 node of
tests/data/gpu-node (driver 580.159.04 loaded by the node image, its user
space on a read-only squashfs at /usr/local/nvidia, ``kernel.modules_disabled=1``, a kernel
without module unload support, no /dev/char links). Each command runs as a person ran it
there (section E of the transcript: the CLI, ``--host-root`` and ``--install-dir
/usr/local/nvidia``), as a child process, through the kernel seams, with the install dir
mounted read-only with no free block. The tests assert what an operator needs to read;
each docstring names the break on the real node it caught.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.recorded_node import VERSION, RecordedNode, build_recorded_node, recorded

CLI = str(Path(sys.executable).parent / "nvidia-driver-installer")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="mknod and mount namespaces need root"),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="builds the fixture nvidia-smi"),
]


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> RecordedNode:
    return build_recorded_node(tmp_path_factory.mktemp("h100"))


def run(node: RecordedNode, *args: str, install_dir: Path | None = None,
        ) -> subprocess.CompletedProcess:
    argv = [CLI, *args, "--host-root", str(node.host_root),
            "--install-dir", str(install_dir or node.install_dir)]
    return subprocess.run(node.squashfs_argv(argv), env={**os.environ, **node.env()},
                          capture_output=True, text=True, timeout=120)


def doctor(node: RecordedNode) -> tuple[int, dict, dict[str, dict]]:
    proc = run(node, "doctor", "-o", "json", "--log-format", "json")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    return proc.returncode, doc, {f["check"]: f for f in doc["findings"]}


def test_detect_reports_the_loaded_driver(node):
    """Caught: detect said ``loaded_driver_version: null`` on the real node (the ``- -``
    columns of /proc/modules on a kernel without module unload support)."""
    proc = subprocess.run([CLI, "detect", "--host-root", str(node.host_root), "-o", "json"],
                          env={**os.environ, **node.env()}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["loaded_driver_version"] == VERSION
    assert doc["kernel_release"] == "6.18.44-fc-v657-gpu"
    assert doc["pretty_name"] == "Ubuntu 24.04.3 LTS"
    assert doc["signatures_enforced"] is True
    # What this node allows: nothing loads or unloads until it reboots.
    assert (doc["modules_disabled"], doc["module_unload"]) == (True, False)
    assert [(g["address"], g["device_id"], g["name"]) for g in doc["gpus"]] == [
        ("0000:00:06.0", "0x2330", "NVIDIA H100 80GB HBM3")]


def test_doctor_reports_a_working_node_image_driver_without_false_findings(node):
    """Caught: doctor cascaded into 8 FAILs on the working node (cache, install_dir,
    kernel_modules, nvidia_smi "not run", host_ld_cache against /home/kubernetes/bin/nvidia,
    module_signing, disk_space) and WARNed that this tool's readiness file is absent. The
    findings left are true: no /dev/char links, and no device plugin has registered (the
    node is not in a cluster)."""
    code, doc, found = doctor(node)
    verdicts = {name: f["verdict"] for name, f in found.items()}
    assert {k: v for k, v in verdicts.items() if v != "ok"} == {
        "dev_char_symlinks": "fail", "device_plugin": "warn"}
    assert code == 9 and doc["healthy"] is False
    assert doc["node"]["loaded_driver_version"] == VERSION
    assert doc["summary"].startswith("UNHEALTHY: 1 check(s) failed (dev_char_symlinks)")
    # The node's own kernel log (its banner, as recorded), never the machine's (issue 43).
    assert found["kernel_log"]["detail"].startswith(
        "0 NVIDIA Xid/GSP line(s) since the driver was loaded"), found["kernel_log"]


def test_doctor_says_whose_driver_it_is(node):
    """Caught: "no NVIDIA kernel module is loaded" and "no .cache record: run install" for a
    driver the node image loaded and nvidia-smi drives; the operator must read whose it is."""
    _, _, found = doctor(node)
    assert found["installer_status"]["detail"] == (
        "driver 580.159.04 loaded by the node image; not installed by this tool; "
        "nvidia-smi works")
    assert found["kernel_modules"]["detail"].startswith(
        "driver 580.159.04 loaded (nvidia_uvm, nvidia) by the node image")
    assert "cannot unload modules" in found["kernel_modules"]["detail"]
    assert found["nvidia_smi"]["detail"] == (
        "driver 580.159.04: NVIDIA H100 80GB HBM3 (00000000:00:06.0)")
    assert "nvidia-modprobe" not in found["install_dir"]["detail"]
    assert "/usr/local/nvidia/lib64/libcuda.so.1" in found["host_ld_cache"]["detail"]
    smi = [c["argv"] for c in node.calls("nvidia-smi")]
    assert ["--query-gpu=name,driver_version,pci.bus_id", "--format=csv,noheader"] in smi


def test_doctor_leaves_the_mig_capability_modes_alone(node):
    """Caught: doctor warned that /dev/nvidia-caps/nvidia-cap1 (0400) and nvidia-cap2
    (0444) are "not mode 0666" and advised chmod 0666: those are NVIDIA's modes for the
    MIG config and monitor capabilities (open-gpu-kernel-modules os.c
    osRmCapRegisterSys); 0666 would hand every container MIG config."""
    _, doc, found = doctor(node)
    f = found["device_nodes"]
    assert f["verdict"] == "ok"
    assert "nvidia-cap1 0400, nvidia-cap2 0444" in f["detail"]
    assert not [g["check"] for g in doc["findings"] if "chmod" in g["fix"] + g["detail"]]


def test_doctor_does_not_call_a_read_only_install_dir_full(node):
    """Caught: "FAIL disk_space: 0 MiB free in /usr/local/nvidia, free disk space" for the
    node image's squashfs, which is read-only and never has a free block."""
    _, _, found = doctor(node)
    f = found["disk_space"]
    assert f["verdict"] == "ok"
    assert "read-only" in f["detail"] and "MiB free" not in f["detail"]
    assert "read-only" in found["install_dir"]["detail"]


def test_doctor_states_modules_disabled_once_as_a_fact(node):
    """Caught: the transcript's doctor said nothing of ``kernel.modules_disabled=1`` and
    failed module_signing instead; a healthy node's limits are a fact, said once."""
    _, doc, found = doctor(node)
    f = found["modules_disabled"]
    assert f["verdict"] == "ok"
    assert f["detail"].startswith("kernel.modules_disabled=1: no module can be loaded or "
                                  "unloaded until reboot")
    assert [g["check"] for g in doc["findings"]
            if "modules_disabled" in g["detail"] + g["fix"]] == ["modules_disabled"]
    assert found["module_signing"]["verdict"] == "ok"


def test_doctor_names_whose_job_the_dev_char_links_are(node):
    """The missing /dev/char links are a real finding, but "re-run install (it creates
    them)" is wrong advice for a driver this tool did not install."""
    _, _, found = doctor(node)
    f = found["dev_char_symlinks"]
    assert f["verdict"] == "fail"
    assert "/dev/char/195:0 (nvidia0) missing" in f["detail"]
    assert "node image" in f["detail"] and "node image's job" in f["fix"]
    assert "re-run install" not in f["fix"]
    assert "\n" not in f["detail"] + f["fix"]


def test_doctor_fails_modules_disabled_when_a_driver_would_have_to_be_loaded(tmp_path):
    """The same node with no NVIDIA module loaded: now modules_disabled is the failure, and
    it says why (install would have to load one, and cannot until reboot)."""
    node = build_recorded_node(tmp_path)
    (node.proc_dir / "modules").write_text("")
    for m in ("nvidia", "nvidia_uvm"):
        shutil.rmtree(node.sys_dir / "module" / m)
    _, _, found = doctor(node)
    f = found["modules_disabled"]
    assert f["verdict"] == "fail"
    assert "no NVIDIA driver is loaded" in f["detail"] and "exits 8" in f["detail"]
    assert found["kernel_modules"]["verdict"] == "fail"


def test_verify_passes_with_what_the_real_nvidia_smi_printed(node):
    """verify passed on the real node; the fixture nvidia-smi prints its recorded line."""
    proc = run(node, "verify", "-o", "json", "--log-format", "json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    name, driver, bus = recorded("nvidia-smi/query-gpu.csv").strip().split(", ")
    assert json.loads(proc.stdout) == [{"name": name, "driver_version": driver, "bus_id": bus}]
    listed = subprocess.run(
        [str(node.install_dir / "bin/nvidia-smi"), "-L"], capture_output=True, text=True,
        env={**os.environ, **node.env(), "LD_LIBRARY_PATH": str(node.install_dir / "lib64")})
    assert listed.stdout == recorded("nvidia-smi/list.txt")


def test_status_names_the_node_image_driver(node):
    """Caught: status said only "the installer has not run on this node (exit 12)", as if
    the node had no driver; it has one, the node image's."""
    proc = run(node, "status", "--log-format", "json")
    assert proc.returncode == 12
    final = json.loads(proc.stderr.strip().splitlines()[-1])
    assert final["error_class"] == "not_installed"
    assert f"driver {VERSION} is loaded, by the node image" in final["message"]
    assert "\n" not in final["message"]


def test_install_dry_run_names_modules_disabled(node, tmp_path):
    """Caught: install --dry-run refused with exit 10 (module.sig_enforce) without naming
    ``kernel.modules_disabled=1``, which refuses every module load first (kernel/module/
    main.c may_init_module) and no signed bundle gets past. docs/contract.md §3: a module load that
    cannot happen is exit 8."""
    # An empty install dir inside the host root, named by --install-dir-host too: the dry
    # run refuses a mismatch as the real run does (exit 2, issue 41).
    empty = node.host_root / "var/lib/empty-nvidia-install"
    empty.mkdir(parents=True)
    try:
        proc = run(node, "install", "--dry-run", "--log-format", "json", "--install-dir-host",
                   "/var/lib/empty-nvidia-install", install_dir=empty)
    finally:
        empty.rmdir()
    assert proc.returncode == 8, proc.stderr[-3000:]
    assert proc.stdout == ""
    final = json.loads(proc.stderr.strip().splitlines()[-1])
    assert final["event"] == "install_failed"
    assert "kernel.modules_disabled" in final["message"]


def test_module_args_read_back_as_applied_from_proc_params(node, monkeypatch):
    """Caught: every ``nvidia.NVreg_*`` was "not applied" on the real node, read from
    /sys/module/nvidia/parameters, which nvidia.ko never makes (nv-linux.h registers its
    options with permission 0); the values are in /proc/driver/nvidia/params, unprefixed."""
    from installer.kmod import modules
    from installer.kmod.kernel import KernelState
    from installer.kmod.moduleargs import ModuleArg

    node.activate(monkeypatch)
    kernel = KernelState()
    assert not (node.sys_dir / "module/nvidia/parameters").exists()
    as_loaded = tuple(ModuleArg.parse(f"nvidia.{w}") for w in (
        "NVreg_EnableGpuFirmware=18", "NVreg_DeviceFileMode=438", "NVreg_ModifyDeviceFiles=1",
        'NVreg_RegistryDwords=""', "NVreg_ResmanDebugLevel=-1"))
    assert modules.params_not_applied(kernel, "nvidia", as_loaded) == []
    other = (ModuleArg.parse("nvidia.NVreg_EnableGpuFirmware=0"),)
    assert modules.params_not_applied(kernel, "nvidia", other) == ["NVreg_EnableGpuFirmware=0"]


def test_the_device_file_step_makes_the_loaded_modules_files_in_an_empty_dev(
        tmp_path, driver_run, monkeypatch):
    """Caught: the step ran ``nvidia-modprobe -c255 -c0 -m`` and required nvidia-modeset's
    file; on this node (nvidia + nvidia_uvm, modules_disabled=1) NVIDIA's nvidia-modprobe
    exits 1 asking for it. In an empty /dev (no /dev/char, as the probe's tmpfs), NVIDIA's
    real nvidia-modprobe (the payload's launcher) makes exactly the four files CUDA needs."""
    from installer.host.runner import Runner
    from installer.kmod import devnodes
    from installer.kmod.kernel import KernelState

    fresh = build_recorded_node(tmp_path / "node")
    for entry in fresh.dev_dir.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    fresh.activate(monkeypatch)
    modprobe = driver_run.payload() / "nvidia-modprobe"
    nodes = devnodes.create(modprobe, KernelState(), Runner(env=KernelState().seam_env()), ())
    assert nodes == ["nvidiactl", "nvidia0", "nvidia-uvm", "nvidia-uvm-tools"]
    found = {}
    for name in nodes:
        st = (fresh.dev_dir / name).stat()
        found[name] = (os.major(st.st_rdev), os.minor(st.st_rdev), st.st_mode & 0o777)
    # The majors and the mode (DeviceFileMode 438) the real node's /dev shows (dev.txt).
    assert found == {"nvidiactl": (195, 255, 0o666), "nvidia0": (195, 0, 0o666),
                     "nvidia-uvm": (238, 0, 0o666), "nvidia-uvm-tools": (238, 1, 0o666)}
    assert not (fresh.dev_dir / "nvidia-modeset").exists()
    assert sorted(os.listdir(fresh.dev_dir / "char")) == ["195:0", "195:255", "238:0", "238:1"]
