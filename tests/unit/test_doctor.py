"""doctor against fake node trees: one healthy node, then one thing broken at a time.

The node is the kit's Ubuntu node and FakeKernel with a finished install on them
(install dir, real ld.so.cache from the real ldconfig, status.json, .cache,
readiness file, device plugin socket, the NVIDIA modules loaded, device nodes).
Each test breaks one thing and checks the finding that names it, its fix, and the
exit code.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from installer import cli
from installer.base import branches
from installer.commands.doctor import host as doctor_host
from installer.commands.doctor import report as doctor_report
from installer.kmod import kernel, signing
from installer.records import cache
from installer.records.cache import CacheKey, ModuleSource
from tests.fixtures import node as fixture_node
from tests.fixtures.kernel import UBUNTU_KERNEL as RELEASE
from tests.fixtures.kernel import UBUNTU_KERNEL_UPDATE, FakeKernel, fake_ko
from tests.fixtures.runfile import build_user_space

V = "580.82.07"  # R580: a supported branch (branches.py), so a healthy node is all OK
INSTALL_HOST = PurePosixPath(fixture_node.INSTALL_HOST)
# The NVIDIA modules and what each needs (NVIDIA's real ones also need drm and video).
NVIDIA_MODULES = {"nvidia": (), "nvidia_modeset": ("nvidia",), "nvidia_uvm": ("nvidia",),
                  "nvidia_drm": ("nvidia_modeset",)}
NODES = {"nvidiactl": (195, 255), "nvidia0": (195, 0), "nvidia-uvm": (511, 0),
         "nvidia-uvm-tools": (511, 1), "nvidia-modeset": (195, 254)}

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of char devices needs root")
pytestmark = [needs_root,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc for real .so files")]


@pytest.fixture(scope="session")
def libs(tmp_path_factory):
    """Real shared libraries with the SONAMEs ldconfig must see."""
    out = tmp_path_factory.mktemp("libs")
    src = out / "x.c"
    src.write_text("int nv_fake(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o",
                    str(out / f"libnvidia-ml.so.{V}"), str(src)], check=True)
    # The fixtures' fake libcuda: doctor's cuda line makes a context with it.
    build_user_space(V, out / "user")
    shutil.copy(out / "user" / f"libcuda.so.{V}", out)
    return out


class FakeNode:
    def __init__(self, tmp: Path, libs: Path):
        self.kernel = FakeKernel(tmp / "kernel", RELEASE)
        tree = fixture_node.build_ubuntu_node(tmp / "host", kernel_release=RELEASE)
        self.root, self.install = tree.root, tree.install_dir
        self.proc, self.sys, self.dev = self.kernel.proc_dir, self.kernel.sys_dir, self.kernel.dev_dir
        self.libs = libs

    # -- building blocks ---------------------------------------------------

    def write(self, path: Path, text: str, mode: int = 0o644) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        return path

    def set_smi(self, line: str, rc: int = 0) -> None:
        self.write(self.install / "bin/nvidia-smi", f"#!/bin/sh\necho '{line}'\nexit {rc}\n", 0o755)

    def build(self) -> FakeNode:
        w = self.write
        w(self.root / "etc/ld.so.conf.d/nvidia.conf", f"{INSTALL_HOST}/lib64\n")
        self.set_smi(f"NVIDIA L4, {V}, 00000000:00:04.0")
        w(self.install / "bin/nvidia-modprobe", "#!/bin/sh\nexit 0\n", 0o755)
        lib64 = self.install / "lib64"
        lib64.mkdir(parents=True)
        for stem in ("libcuda", "libnvidia-ml"):
            shutil.copy(self.libs / f"{stem}.so.{V}", lib64)
            os.symlink(f"{stem}.so.{V}", lib64 / f"{stem}.so.1")
        (self.install / "drivers").mkdir()
        (self.install / "drivers/nvidia.ko").write_bytes(fake_ko("nvidia", RELEASE, version=V))
        self.ldconfig()
        cache.write(self.install / ".cache", CacheKey(V, kernel_release=RELEASE,
                                                      source=ModuleSource.COMPILED,
                                                      module_type="proprietary"),
                    self.install, "test")
        self.set_status(outcome="ok", exit_code=0, driver_version=V, plan="fresh",
                        duration_s=42.0)
        w(self.root / "run/nvidia/validations/driver-ready",
          f"IS_HOST_DRIVER=true\nNVIDIA_DRIVER_VERSION={V}\nREADY_AT=2026-01-01T00:00:00Z\n")
        self.plugin_socket()
        self.kernel.add_gpu()  # an L4 at 0000:00:04.0, before nvidia.ko can load
        for name, deps in NVIDIA_MODULES.items():
            self.kernel.preload(fake_ko(name, RELEASE, version=V, depends=deps))
        for name, (major, minor) in NODES.items():
            os.mknod(self.dev / name, stat.S_IFCHR | 0o666, os.makedev(major, minor))
            os.chmod(self.dev / name, 0o666)
            (self.dev / "char").mkdir(exist_ok=True)
            os.symlink(f"../{name}", self.dev / "char" / f"{major}:{minor}")
        return self

    def ldconfig(self) -> None:
        subprocess.run(["ldconfig", "-r", str(self.root)], check=True, capture_output=True)

    def set_status(self, **fields) -> None:
        self.write(self.install / "status.json", json.dumps(
            {"finished_at": "2026-01-01T00:00:00Z", **fields}))

    def plugin_socket(self) -> None:
        d = self.root / "var/lib/kubelet/device-plugins"
        d.mkdir(parents=True)
        cwd = os.getcwd()
        os.chdir(d)  # AF_UNIX paths are limited to 108 bytes: bind relative
        try:
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.bind("nvidia-gpu.sock")
        finally:
            os.chdir(cwd)


    # -- running doctor ----------------------------------------------------

    def doctor(self, *extra: str, capsys) -> tuple[int, str]:
        with pytest.raises(SystemExit) as exit_:
            cli.main(["doctor", "--host-root", str(self.root), "--install-dir",
                      str(self.install), "--log-format", "json", *extra])
        return exit_.value.code, capsys.readouterr().out

    def findings(self, capsys) -> tuple[int, dict[str, dict]]:
        code, out = self.doctor("-o", "json", capsys=capsys)
        doc = json.loads(out)
        assert doc["healthy"] is (code == 0)
        return code, {f["check"]: f for f in doc["findings"]}


@pytest.fixture
def node(tmp_path, libs, monkeypatch):
    n = FakeNode(tmp_path, libs).build()
    kernel.use_roots(kernel.KernelRoots(n.proc, n.sys, n.dev))
    monkeypatch.setattr(doctor_host.shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(100 << 30, 50 << 30, 50 << 30))
    yield n
    n.sock.close()


def test_healthy_node_passes_every_check(node, capsys):
    code, found = node.findings(capsys)
    assert code == 0
    assert {k: f["verdict"] for k, f in found.items()} == {k: "ok" for k, _ in doctor_report.CHECKS}
    assert "NVIDIA L4 at 0000:00:04.0" in found["gpus"]["detail"]
    assert f"libcuda.so.1 => {INSTALL_HOST}/lib64/libcuda.so.1" in found["host_ld_cache"]["detail"]
    assert "5 link(s)" in found["dev_char_symlinks"]["detail"]
    assert "nvidia-gpu.sock" in found["device_plugin"]["detail"]


def test_healthy_table_is_readable(node, capsys):
    code, out = node.doctor(capsys=capsys)
    lines = out.rstrip().splitlines()
    assert code == 0
    assert lines[0].startswith("nvidia-driver-installer doctor: ubuntu, kernel " + RELEASE)
    assert lines[-2] == "" and lines[-1].startswith("HEALTHY")
    assert not [ln for ln in lines if ln.strip().startswith("fix:")]


def test_missing_device_nodes(node, capsys):
    for name in ("nvidia-uvm", "nvidia-uvm-tools"):
        (node.dev / name).unlink()
    code, found = node.findings(capsys)
    assert code == 9
    f = found["device_nodes"]
    assert f["verdict"] == "fail"
    assert "/dev/nvidia-uvm, /dev/nvidia-uvm-tools" in f["detail"]
    assert "nvidia-modprobe -c255 -c0 -m" in f["fix"]


def test_missing_dev_char_links(node, capsys):
    shutil.rmtree(node.dev / "char")
    code, found = node.findings(capsys)
    assert code == 9
    f = found["dev_char_symlinks"]
    assert f["verdict"] == "fail" and "/dev/char/195:0 (nvidia0) missing" in f["detail"]
    assert "Failed to initialize NVML: Unknown Error" in f["fix"]


def test_device_nodes_not_world_accessible(node, capsys):
    os.chmod(node.dev / "nvidia0", 0o660)
    code, found = node.findings(capsys)
    assert code == 0  # a warning, not a failure
    assert found["device_nodes"]["verdict"] == "warn"
    assert "/dev/nvidia0" in found["device_nodes"]["detail"]


def test_stale_cache_after_kernel_update(node, capsys):
    node.write(node.proc / "sys/kernel/osrelease", UBUNTU_KERNEL_UPDATE + "\n")
    code, found = node.findings(capsys)
    assert code == 9
    f = found["cache"]
    assert f["verdict"] == "fail"
    assert f"for kernel {RELEASE}" in f["detail"]
    assert f"the node runs kernel {UBUNTU_KERNEL_UPDATE}" in f["detail"]
    assert "rebuilds" in f["fix"]


def test_tampered_install_files(node, capsys):
    (node.install / "drivers/nvidia.ko").write_text("corrupt")
    code, found = node.findings(capsys)
    assert code == 9
    assert "drivers/nvidia.ko has changed" in found["cache"]["detail"]
    assert "--force" in found["cache"]["fix"]


def test_loaded_version_differs_and_in_use(node, capsys):
    node.write(node.sys / "module/nvidia/version", "535.183.01\n")
    node.kernel.hold("nvidia", 2)  # 2 references besides nvidia_uvm and nvidia_modeset
    code, found = node.findings(capsys)
    assert code == 9
    f = found["kernel_modules"]
    assert f["verdict"] == "fail"
    assert "driver 535.183.01" in f["detail"] and f"the install dir holds {V}" in f["detail"]
    assert "in use by nvidia: 2 reference(s)" in f["detail"]
    assert "kubectl drain" in f["fix"]


@pytest.mark.parametrize("written_by", ["this version", "the previous version"])
def test_a_staged_version_is_told_apart_from_the_running_one(node, capsys, written_by):
    """Issue 34 §4: the running and the staged version are two fields; a status.json the
    previous version wrote (the staged one as driver_version) reads the same."""
    if written_by == "this version":
        node.set_status(outcome="ok", exit_code=0, plan="staged", driver_version=V,
                        staged_driver_version="590.44.01", in_use_by="nvidia: 1 reference(s)")
    else:
        node.set_status(outcome="ok", exit_code=0, plan="staged", driver_version="590.44.01",
                        staged_for_next_boot={"running_version": V,
                                              "holders": "nvidia: 1 reference(s)"})
    code, found = node.findings(capsys)
    f = found["installer_status"]
    assert f["verdict"] == "warn"
    assert f"driver {V} keeps running (in use: nvidia: 1 reference(s)); 590.44.01 is staged" \
        in f["detail"]
    assert found["kernel_modules"]["verdict"] == "ok", found["kernel_modules"]


def test_loaded_version_differs_not_in_use(node, capsys):
    node.write(node.sys / "module/nvidia/version", "535.183.01\n")
    code, found = node.findings(capsys)
    assert code == 9
    assert "unloaded and replaced" in found["kernel_modules"]["fix"]


def test_nothing_loaded(node, capsys):
    node.kernel.unload_all()  # a reboot: /proc/modules and /sys/module agree
    code, found = node.findings(capsys)
    assert code == 9
    assert found["kernel_modules"]["detail"] == "no NVIDIA kernel module is loaded"
    assert found["nvidia_smi"]["verdict"] == "fail"
    assert found["readiness"]["verdict"] == "ok"  # stale file, but nothing loaded to compare


def test_k80_with_a_too_new_driver(node, capsys):
    shutil.rmtree(node.sys / "bus/pci/devices/0000:00:04.0")
    node.kernel.add_gpu("0000:00:05.0", "0x102d")
    code, found = node.findings(capsys)
    assert code == 9
    f = found["gpus"]
    assert f["verdict"] == "fail"
    assert "too new for Tesla K80" in f["detail"] and "R470 or older" in f["detail"]


def test_no_gpu_on_the_bus(node, capsys):
    shutil.rmtree(node.sys / "bus/pci/devices")
    code, found = node.findings(capsys)
    assert code == 9
    assert "no NVIDIA GPU on the PCI bus" in found["gpus"]["detail"]
    assert "fallen off the bus" in found["gpus"]["fix"]


@pytest.mark.parametrize("how", ["efivar", "sig_enforce", "lockdown"])
def test_secure_boot_blocks_unsigned_modules(node, capsys, how):
    node.kernel.unload_all()  # a reboot: nothing loaded, the build would be refused
    if how == "efivar":
        efivar = node.sys / signing.SECURE_BOOT_EFIVAR
        efivar.parent.mkdir(parents=True)
        efivar.write_bytes(b"\x06\x00\x00\x00\x01")
        node.write(node.sys / "kernel/security/lockdown", "none [integrity] confidentiality\n")
    elif how == "sig_enforce":
        node.kernel.set_sig_enforce(True)
    else:
        node.kernel.set_lockdown("integrity")
    code, found = node.findings(capsys)
    assert code == 9
    f = found["module_signing"]
    assert f["verdict"] == "fail" and "only loads signed modules" in f["detail"]
    assert {"efivar": "Secure Boot is on", "sig_enforce": "module.sig_enforce",
            "lockdown": "lockdown=integrity"}[how] in f["detail"]


@pytest.mark.parametrize("value", [0, 1])
def test_secure_boot_without_enforcement_lets_unsigned_modules_load(node, capsys, value):
    # The kernel's sig_enforce and lockdown decide; Secure Boot alone refuses nothing.
    efivar = node.sys / signing.SECURE_BOOT_EFIVAR
    efivar.parent.mkdir(parents=True)
    efivar.write_bytes(b"\x06\x00\x00\x00" + bytes([value]))
    _, found = node.findings(capsys)
    assert found["module_signing"]["verdict"] == "ok"
    assert "unsigned modules may load" in found["module_signing"]["detail"]
    assert ("although Secure Boot is on" in found["module_signing"]["detail"]) is bool(value)


def test_secure_boot_with_signed_modules_loaded_is_fine(node, capsys):
    node.kernel.set_sig_enforce(True)
    code, found = node.findings(capsys)
    assert code == 0
    assert "were accepted" in found["module_signing"]["detail"]


def test_missing_ld_cache_entry(node, capsys):
    (node.root / "etc/ld.so.conf.d/nvidia.conf").unlink()
    node.ldconfig()
    code, found = node.findings(capsys)
    assert code == 9
    f = found["host_ld_cache"]
    assert f["verdict"] == "fail"
    assert "libcuda.so.1 is not in the host ld cache" in f["detail"]
    assert "libnvidia-ml.so.1 is not in the host ld cache" in f["detail"]
    assert "ld.so.conf.d/nvidia.conf" in f["fix"]


def test_ld_cache_resolving_another_copy_first(node, capsys):
    other = node.root / "usr/lib/x86_64-linux-gnu"  # the node's multiarch dir
    shutil.copy(node.libs / f"libcuda.so.{V}", other)
    node.write(node.root / "etc/ld.so.conf", "/usr/lib/x86_64-linux-gnu\n"
               "include /etc/ld.so.conf.d/*.conf\n")
    node.ldconfig()
    code, found = node.findings(capsys)
    assert code == 9
    detail = found["host_ld_cache"]["detail"]
    assert "libcuda.so.1 resolves to /usr/lib/x86_64-linux-gnu/libcuda.so.1 before" in detail


def test_no_host_ld_cache_at_all(node, capsys):
    (node.root / "etc/ld.so.cache").unlink()
    code, found = node.findings(capsys)
    assert code == 9 and "no /etc/ld.so.cache" in found["host_ld_cache"]["detail"]


def test_failed_last_run_is_reported_with_its_hint(node, capsys):
    node.set_status(outcome="error", exit_code=8, error_class="module_load",
                    driver_version="535.183.01", message="NVIDIA driver 550.54.14 is loaded and "
                    "in use (nvidia: 1 reference(s))", hint="drain GPU workloads",
                    context={"step": "check_loaded_driver"})
    code, found = node.findings(capsys)
    assert code == 9
    f = found["installer_status"]
    assert f["verdict"] == "fail"
    assert ("in step check_loaded_driver: the upgrade to 535.183.01 failed (module_load, "
            "exit 8)") in f["detail"]
    assert f["detail"].endswith(f"Driver {V} is still loaded, installed intact and working")
    assert f["fix"].startswith("drain GPU workloads; then re-run install")
    # The loaded driver is the installed one, whole: it works; no "version mismatch".
    km = found["kernel_modules"]
    assert km["verdict"] == "warn" and "mismatch" not in km["detail"]
    assert "the upgrade to 535.183.01 failed (module_load, exit 8)" in km["detail"]
    # The failed run put back the readiness file it found; had there been none, it says so.
    assert found["readiness"]["verdict"] == "ok"
    (node.root / "run/nvidia/validations/driver-ready").unlink()
    ready = node.findings(capsys)[1]["readiness"]
    assert ready["verdict"] == "warn"
    assert ready["detail"].startswith("/run/nvidia/validations/driver-ready is absent, and the "
                                      "upgrade to 535.183.01 failed (module_load, exit 8): a "
                                      "failed run puts back only a file it found")


def test_a_run_that_failed_before_choosing_a_version_names_none(node, capsys):
    node.set_status(outcome="error", exit_code=3, error_class="host", driver_version=None,
                    message="no /etc/os-release on the host")
    f = node.findings(capsys)[1]["installer_status"]
    assert "None" not in f["detail"] and "installing driver" not in f["detail"]
    assert f["detail"].endswith("(exit 3): no /etc/os-release on the host")


def test_failed_last_run_with_a_damaged_old_install_is_a_mismatch(node, capsys):
    """Only an intact old install counts as working: otherwise the libraries may not match."""
    node.set_status(outcome="error", exit_code=5, error_class="download",
                    driver_version="535.183.01", message="HTTP 404 NOT FOUND")
    next((node.install / "lib64").glob("libcuda.so.*")).write_bytes(b"changed")
    code, found = node.findings(capsys)
    assert code == 9
    km = found["kernel_modules"]
    assert km["verdict"] == "fail" and "the last run wanted 535.183.01" in km["detail"]
    assert "the upgrade" not in found["installer_status"]["detail"]


def test_never_ran_and_not_ready_are_warnings(node, capsys):
    (node.install / "status.json").unlink()
    (node.root / "run/nvidia/validations/driver-ready").unlink()
    node.sock.close()
    (node.root / "var/lib/kubelet/device-plugins/nvidia-gpu.sock").unlink()
    code, found = node.findings(capsys)
    assert code == 0
    for check in ("installer_status", "readiness", "device_plugin"):
        assert found[check]["verdict"] == "warn", check
    assert "driver-ready is absent" in found["readiness"]["detail"]


def test_stale_plugin_file_is_a_warning(node, capsys):
    node.sock.close()
    sock = node.root / "var/lib/kubelet/device-plugins/nvidia-gpu.sock"
    sock.unlink()
    sock.write_text("")
    _, found = node.findings(capsys)
    assert found["device_plugin"]["verdict"] == "warn"
    assert "not a socket" in found["device_plugin"]["detail"]


def test_missing_library_in_install_dir(node, capsys):
    (node.install / f"lib64/libnvidia-ml.so.{V}").unlink()  # the SONAME link dangles
    code, found = node.findings(capsys)
    assert code == 9
    assert "lib64/libnvidia-ml.so.1" in found["install_dir"]["detail"]


def test_nvidia_smi_failure_is_explained(node, capsys):
    node.set_smi("Failed to initialize NVML: Driver/library version mismatch", rc=18)
    code, found = node.findings(capsys)
    assert code == 9
    f = found["nvidia_smi"]
    assert "version mismatch" in f["detail"] and "another driver version" in f["fix"]


@pytest.mark.parametrize(("free", "verdict"), [(100 << 20, "fail"), (1 << 30, "warn")])
def test_low_disk(node, capsys, monkeypatch, free, verdict):
    monkeypatch.setattr(doctor_host.shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(100 << 30, 100 << 30, free))
    code, found = node.findings(capsys)
    assert found["disk_space"]["verdict"] == verdict
    assert code == (9 if verdict == "fail" else 0)


def test_a_crashing_check_does_not_hide_the_others(node, capsys, monkeypatch):
    def boom(n):
        raise RuntimeError("unexpected layout")

    monkeypatch.setattr(doctor_report, "CHECKS", (("gpus", boom), *doctor_report.CHECKS[2:]))
    code, found = node.findings(capsys)
    assert code == 9
    assert found["gpus"]["detail"] == "the check itself failed: RuntimeError: unexpected layout"
    assert found["disk_space"]["verdict"] == "ok"


def test_unreadable_host_still_reports(node, capsys):
    (node.root / "etc/os-release").unlink()
    code, found = node.findings(capsys)
    assert code == 9
    assert found["host"]["verdict"] == "fail" and "os-release" in found["host"]["fix"]
    assert found["gpus"]["verdict"] == "ok"


def test_table_puts_the_fix_under_each_failure(node, capsys):
    (node.dev / "nvidia-uvm").unlink()
    node.write(node.proc / "sys/kernel/osrelease", UBUNTU_KERNEL_UPDATE + "\n")
    code, out = node.doctor(capsys=capsys)
    lines = out.rstrip().splitlines()
    assert code == 9
    fail_rows = [i for i, ln in enumerate(lines) if ln.startswith("  FAIL")]
    assert len(fail_rows) == 2
    for i in fail_rows:
        following = lines[i + 1:]
        fix_at = next(j for j, ln in enumerate(following) if ln.strip().startswith("fix:"))
        assert not any(ln.startswith("  FAIL") or ln.startswith("  ok")
                       for ln in following[:fix_at])
    summary = " ".join(lines[len(lines) - lines[::-1].index(""):])  # after the last blank line
    assert "UNHEALTHY: 2 check(s) failed (cache, device_nodes). Start with cache:" in summary
    assert max(len(ln) for ln in lines) <= 140


def test_gsp_firmware_the_kernel_cannot_find_fails(node, capsys):
    gsp = node.write(node.install / f"firmware/nvidia/{V}/gsp_ga10x.bin", "GSP")
    param = node.write(node.sys / "module/firmware_class/parameters/path", "\n")
    code, found = node.findings(capsys)
    assert code == 9
    f = found["gpu_firmware"]
    assert f["verdict"] == "fail"
    assert f"nvidia/{V}/gsp_ga10x.bin" in f["detail"] and "firmware_class.path" in f["fix"]
    param.write_text(f"{INSTALL_HOST}/firmware")
    code, found = node.findings(capsys)
    assert code == 0 and found["gpu_firmware"]["verdict"] == "ok"
    # Or where the loader looks by default, with the parameter left to someone else.
    param.write_text("/opt/elsewhere")
    copy = node.write(node.root / f"lib/firmware/updates/nvidia/{V}/gsp_ga10x.bin", "GSP")
    assert copy.exists() and gsp.exists()
    assert node.findings(capsys)[1]["gpu_firmware"]["verdict"] == "ok"


def test_corrupt_status_file_is_reported_as_corrupt(node, capsys):
    node.write(node.install / "status.json", "[1, 2]")
    code, found = node.findings(capsys)
    assert code == 9
    f = found["installer_status"]
    assert f["detail"] == "corrupt status file: status.json holds a JSON list, not an object"
    assert f["fix"] == "remove /home/kubernetes/bin/nvidia/status.json; the next install writes a new one"


@pytest.mark.parametrize("build", ["17800.1.1", fixture_node.COS_BUILD_ID])
def test_a_cos_record_is_judged_by_the_cos_build(node, capsys, build):
    """The COS distro says what keys an install (its build) and how to read v2's record."""
    node.write(node.root / "etc/os-release", fixture_node.COS_113)
    node.write(node.install / ".cache", f"DRIVER_VERSION={V}\nKERNEL_OPEN=Y\nBUILD_ID={build}\n")
    _code, found = node.findings(capsys)
    f = found["cache"]
    if build == fixture_node.COS_BUILD_ID:
        assert f["verdict"] == "ok", f
        assert f["detail"] == f"driver {V} for build {build} (prebuilt open modules)"
    else:
        assert f["verdict"] == "fail"
        assert f["detail"] == (f"stale: cached for build {build}, the node runs build "
                               f"{fixture_node.COS_BUILD_ID} (node image upgraded?)")
        assert "reinstalls for this build" in f["fix"]


# -- GKE's own installer on the node (issue 26) --------------------------------------

UID = "0f3c2a4e-1b2c-4d5e-8f90-123456789abc"
# What the kubelet keeps of an init container's output: CRI log lines (<time> <stream> <P|F>
# <text>). GKE's cos-gpu-installer logs glog lines; ours, JSON events.
GKE_LOG = ("2026-01-01T00:00:00.1Z stderr F I0101 00:00:00.100000  1 install.go:226] "
           "Installing GPU driver version 535.183.01\n")
OUR_LOG = ('2026-01-01T00:00:00.1Z stderr F {"event": "install_finished", "level": "info", '
           '"timestamp": "2026-01-01T00:00:00Z"}\n')


def _pod_log(node, pod: str, text: str) -> str:
    pod_dir = f"kube-system_{pod}_{UID}"
    node.write(node.root / "var/log/pods" / pod_dir / "nvidia-driver-installer/0.log", text)
    return f"/var/log/pods/{pod_dir}"


def test_gkes_installer_pod_on_the_node_is_a_warning(node, capsys):
    where = _pod_log(node, "nvidia-driver-installer-x2b4z", GKE_LOG)
    code, found = node.findings(capsys)
    f = found["gke_installer"]
    assert code == 0 and f["verdict"] == "warn"
    assert where in f["detail"] and "host lock" in f["detail"]
    assert "kubectl -n kube-system delete daemonset nvidia-driver-installer" in f["fix"]
    assert "gpu-driver-version=disabled" in f["fix"]


@pytest.mark.parametrize("pod, log", [
    ("nvidia-driver-installer-ubuntu-x2b4z", GKE_LOG),  # our DaemonSet's pod
    ("nvidia-driver-installer-ubuntu-pool-a-x2b4z", GKE_LOG),  # ours, --name pool-a
    ("nvidia-driver-installer-x2b4z", OUR_LOG),  # our image in GKE's DaemonSet (drop-in)
    ("nvidia-gpu-device-plugin-x2b4z", GKE_LOG),
])
def test_our_own_pods_are_not_gkes_installer(node, capsys, pod, log):
    _pod_log(node, pod, log)
    f = node.findings(capsys)[1]["gke_installer"]
    assert f["verdict"] == "ok" and f["detail"].startswith("no pod of GKE's installer")


def test_a_fifo_for_a_log_never_hangs_doctor(node, capsys):
    log_dir = node.root / f"var/log/pods/kube-system_nvidia-driver-installer-x2b4z_{UID}"
    (log_dir / "nvidia-driver-installer").mkdir(parents=True)
    os.mkfifo(log_dir / "nvidia-driver-installer/0.log")
    f = node.findings(capsys)[1]["gke_installer"]
    assert f["verdict"] == "warn"  # its pod is there; what it runs is unknown


def test_a_cache_gkes_installer_wrote_is_said(node, capsys):
    # cos-gpu-installer entrypoint.sh L184-187 / GKE's Ubuntu entrypoint: these lines only
    node.write(node.install / ".cache", f"CACHE_KERNEL_VERSION={RELEASE}\n"
               f"CACHE_NVIDIA_DRIVER_VERSION={V}\n")
    f = node.findings(capsys)[1]["gke_installer"]
    assert f["verdict"] == "ok" and "written by GKE's installer" in f["detail"]


def test_driver_branch_ok_names_the_branch_and_the_policy_date(node, capsys):
    _, found = node.findings(capsys)
    f = found["driver_branch"]
    assert f["verdict"] == "ok"
    assert f["detail"].startswith(f"driver {V}: R580, long-term branch, supported until mid-2028")
    assert f"driver branch policy of {branches.POLICY_DATE}" in f["detail"]


def test_a_driver_from_an_ended_branch_is_a_warning_not_a_failure(node, capsys):
    node.write(node.sys / "module/nvidia/version", "535.183.01\n")
    _, found = node.findings(capsys)
    f = found["driver_branch"]
    assert f["verdict"] == "warn"
    assert "driver 535.183.01 is from R535, a long-term branch past its end of life (June " \
        "2026" in f["detail"]
    assert f"R580 (e.g. {branches.RECOMMENDED_VERSION})" in f["detail"]
    assert "NVIDIA_DRIVER_VERSION" in f["fix"]


# --- issue 31: the daemons, the fabric, CUDA, the kernel log, each on its own line ------


def test_xid_lines_that_need_a_reboot_or_reset_fail_the_kernel_log_line(node, capsys):
    # The driver's own words (NVIDIA/open-gpu-kernel-modules issues #1151, #1271); the
    # deprecation line is the real H100 node's, and harmless.
    node.kernel.kernel_log("NVRM: Persistence mode is deprecated and will be removed in a "
                           "future release. Please use nvidia-persistenced instead.")
    node.kernel.kernel_log("NVRM: Xid (PCI:0000:00:04): 13, Graphics Exception")
    code, found = node.findings(capsys)
    assert code == 0 and found["kernel_log"]["verdict"] == "ok", found["kernel_log"]
    assert found["kernel_log"]["detail"].startswith(
        "1 NVIDIA Xid/GSP line(s) since the driver was loaded, none asking")
    node.kernel.kernel_log("NVRM: Xid (PCI:0000:00:04): 119, pid=1234, name=python, Timeout "
                           "after 6s of waiting for RPC response from GPU0 GSP!")
    code, found = node.findings(capsys)
    assert code == 9
    assert found["kernel_log"]["detail"] == "Xid 119 (PCI:0000:00:04): GSP RPC timeout"
    assert found["kernel_log"]["fix"] == "drain the node, then reset the GPU (nvidia-smi -r) or reboot"
    node.kernel.kernel_log("NVRM: Xid (PCI:0000:00:04): 79, GPU has fallen off the bus.")
    _, found = node.findings(capsys)
    assert "Xid 79 (PCI:0000:00:04): GPU has fallen off the bus" in found["kernel_log"]["detail"]
    assert found["kernel_log"]["fix"] == "drain the node, then reboot it"


def test_xid_154_says_the_recovery_in_words(node, capsys):
    node.kernel.kernel_log("NVRM: Xid (PCI:0000:00:04): 154, GPU recovery action changed from "
                           "0x0 (None) to 0x1 (GPU Reset Required)")
    _, found = node.findings(capsys)
    assert found["kernel_log"]["verdict"] == "fail"
    assert "Xid 154 (PCI:0000:00:04): GPU recovery action changed" in found["kernel_log"]["detail"]


def test_an_xid_from_before_the_current_driver_load_does_not_fail_it(node, capsys):
    """Issue 38 item 6: only lines since nvidia.ko's last load banner count (nv.c
    nvidia_init_module: "NVRM: loading %s"; the H100 node's own banner below)."""
    node.kernel.kernel_log("NVRM: Xid (PCI:0000:00:04): 79, GPU has fallen off the bus.")
    node.kernel.kernel_log("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  "
                           "580.159.04  Release Build  (nixbld@)  ")
    code, found = node.findings(capsys)
    assert found["kernel_log"]["verdict"] == "ok", found["kernel_log"]
    assert found["kernel_log"]["detail"].startswith("0 NVIDIA Xid/GSP line(s) since the driver")
    node.kernel.kernel_log("NVRM: Xid (PCI:0000:00:04): 79, GPU has fallen off the bus.")
    code, found = node.findings(capsys)
    assert code == 9 and found["kernel_log"]["fix"] == "drain the node, then reboot it"


def test_a_cuda_failure_is_its_own_line_with_the_cause(node, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_FAIL", "cuInit:999")
    code, found = node.findings(capsys)
    assert code == 9 and found["nvidia_smi"]["verdict"] == "ok"
    assert found["cuda"]["detail"].startswith("CUDA check: cuInit returned 999 CUDA_ERROR_UNKNOWN")
    assert "/dev/nvidia-uvm" in found["cuda"]["fix"]


def test_a_dead_daemon_sidecar_and_an_unfinished_fabric_fail_their_lines(node, capsys):
    from installer.services import supervise as daemons

    daemons.write_state(node.install, daemons.FABRIC_MANAGER, daemons.EXITED,
                        "fabricmanager exited with status 1: [ERROR] no NVSwitch")
    node.kernel.add_nvswitch()
    node.set_smi("00000000:00:04.0, In Progress, N/A")
    code, found = node.findings(capsys)
    assert code == 9
    assert found["daemons"] == {"check": "daemons", "verdict": "fail", "detail": "fabricmanager: "
                                "fabricmanager exited with status 1: [ERROR] no NVSwitch",
                                "fix": "read the sidecar's log (kubectl logs <pod> -c "
                                "nvidia-<daemon>)"}
    assert found["nvlink_fabric"]["verdict"] == "fail"
    assert found["nvlink_fabric"]["detail"] == ("NVSwitch gen 3 (ls10, HGX H100/H200): "
                                                "0000:00:10.0, device files: none; "
                                                "00000000:00:04.0 In Progress/N/A")


def test_a_trained_hgx_a100_fabric_is_ok_though_nvml_reads_na(node, capsys):
    """Issue 38 item 3: NVSwitch gen 2 (lr10, nvswitch.c nvswitch_lr10_device_ids); A100s keep
    no fabric state (nvmlDeviceGetGpuFabricInfo is Hopper-or-newer), so N/A is no failure
    there: the cuda line proves the fabric. Today's main fails this line for good."""
    from tests.fixtures.kernel import NVSWITCH_LR10

    node.kernel.add_nvswitch(device=NVSWITCH_LR10)
    node.write(node.proc / "driver/nvidia/fake-fabric-state", "Completed\n")  # trained
    node.set_smi("00000000:00:04.0, N/A, N/A")
    _code, found = node.findings(capsys)
    assert found["nvlink_fabric"]["verdict"] == "ok", found["nvlink_fabric"]
    assert found["nvlink_fabric"]["detail"].startswith("NVSwitch gen 2 (lr10, HGX A100)")


def test_the_health_sidecars_verdict_is_a_line_of_its_own(node, capsys):
    """Issue 41: doctor reads the verdict the health sidecar keeps (daemons/health.json)."""
    from installer.services import health
    from installer.services.health import Health

    _, found = node.findings(capsys)
    assert found["gpu_health"]["detail"].startswith("no health sidecar reports here")
    health.write_status(node.install, Health(0.0, V, None, 1, 1))
    _, found = node.findings(capsys)
    assert found["gpu_health"] == {
        "check": "gpu_health", "verdict": "ok", "fix": "",
        "detail": "the health sidecar found no problem (checked 1970-01-01T00:00:00Z)"}
    health.write_status(node.install, Health(
        0.0, V, None, 1, 1, {("79", "reboot"): 1}, {},
        ("Xid 79 (PCI:0000:00:04): GPU has fallen off the bus",), "reboot"))
    code, found = node.findings(capsys)
    assert code != 0 and found["gpu_health"]["verdict"] == "fail"
    assert found["gpu_health"]["detail"] == (
        "the health sidecar says action reboot (checked 1970-01-01T00:00:00Z): "
        "Xid 79 (PCI:0000:00:04): GPU has fallen off the bus")
