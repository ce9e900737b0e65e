import glob
import shutil
import subprocess

import pytest

from installer.kmod.kernel import KernelState, module_name, parse_proc_modules
from installer.kmod.modinfo import module_depends, read_modinfo, vermagic_release
from installer.kmod.moduleargs import ModuleArg, for_module
from installer.kmod.modules import (
    ModuleLoad,
    loaded_params,
    params_not_applied,
    plan_loads,
    users,
)
from installer.kmod.signing import cmdline_enforces_signatures, parse_lockdown
from tests.fixtures.fakekmod import driver_params_text
from tests.fixtures.kernel import fake_ko

PROC_MODULES = """nvidia_uvm 1380352 0 - Live 0x0000000000000000 (POE)
nvidia_modeset 1241088 1 nvidia_drm, Live 0x0000000000000000 (POE)
nvidia 56823808 3 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (POE)
drm 622592 4 nvidia_drm,drm_kms_helper, Live 0x0000000000000000
"""


def test_parse_proc_modules():
    mods = parse_proc_modules(PROC_MODULES)
    assert mods["nvidia"].refcnt == 3
    assert mods["nvidia"].used_by == ("nvidia_uvm", "nvidia_modeset")
    assert mods["nvidia_uvm"].used_by == ()


def test_module_name():
    assert module_name("/x/nvidia-uvm.ko") == "nvidia_uvm"
    assert module_name("nvidia") == "nvidia"


def test_signature_and_lockdown_parsers():
    assert cmdline_enforces_signatures("ro module.sig_enforce=1 quiet")
    assert not cmdline_enforces_signatures("ro module.sig_enforce=0")
    assert parse_lockdown("none [integrity] confidentiality") == "integrity"


def test_users_counts_open_handles_and_foreign_holders(tmp_path):
    (tmp_path / "modules").write_text(PROC_MODULES)
    kernel = KernelState(proc_dir=tmp_path, sys_dir=tmp_path)
    # nvidia: refcnt 3, two users are our own modules -> 1 other reference.
    assert users(kernel) == {"nvidia": ["1 reference(s)"]}


def test_read_modinfo_from_real_elf_layout(tmp_path):
    ko = tmp_path / "nvidia-drm.ko"
    ko.write_bytes(fake_ko("nvidia_drm", "6.1.0-18-amd64", version="550.54.14",
                           depends=("drm", "drm_kms_helper", "nvidia-modeset"), signed=True))
    info = read_modinfo(ko)
    assert vermagic_release(info) == "6.1.0-18-amd64"
    assert module_depends(info) == ["drm", "drm_kms_helper", "nvidia_modeset"]


KBUILD_TREES = sorted(glob.glob("/lib/modules/*/build/Makefile"))


@pytest.mark.skipif(not KBUILD_TREES or not shutil.which("make"),
                    reason="no kernel headers to build a real module with")
def test_read_modinfo_of_a_module_kbuild_built(tmp_path):
    """A real .ko (kbuild, modpost: many sections, .modinfo among them) reads as the fixtures' do."""
    (tmp_path / "Kbuild").write_text("obj-m := ndi_probe.o\n")
    (tmp_path / "ndi_probe.c").write_text(
        '#include <linux/module.h>\nMODULE_LICENSE("GPL");\nMODULE_VERSION("550.54.14");\n'
        "static int __init probe_init(void) { return 0; }\nmodule_init(probe_init);\n")
    build = KBUILD_TREES[-1].removesuffix("/Makefile")
    done = subprocess.run(["make", "-C", build, f"M={tmp_path}", "modules"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    info = read_modinfo(tmp_path / "ndi_probe.ko")
    release = build.split("/")[3]
    assert (info["name"], info["version"], info["license"]) == ("ndi_probe", "550.54.14", "GPL")
    assert vermagic_release(info) == release and module_depends(info) == []


def test_plan_loads_order_params_and_in_tree_deps(tmp_path):
    for stem, deps in (("nvidia-drm", ("nvidia-modeset", "drm_kms_helper")), ("nvidia", ()),
                       ("nvidia-uvm", ("nvidia",)), ("nvidia-modeset", ("nvidia",))):
        (tmp_path / f"{stem}.ko").write_bytes(fake_ko(module_name(stem), "5.15", depends=deps))
    args = tuple(map(ModuleArg.parse, ("nvidia.NVreg_EnableGpuFirmware=0", "nvidia-uvm.uvm_perf=1")))
    # By default what CUDA needs, as GKE's Ubuntu installer loads (modules.COMPUTE_MODULES).
    assert [m.name for m in plan_loads(tmp_path, args)] == ["nvidia", "nvidia_uvm"]
    loads = plan_loads(tmp_path, args, display_modules=True)
    assert [m.name for m in loads] == ["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]
    assert [a.insmod_word for a in loads[0].params] == ["NVreg_EnableGpuFirmware=0"]
    assert [a.insmod_word for a in loads[1].params] == ["uvm_perf=1"]
    assert loads[3].in_tree_deps == ("drm_kms_helper",)
    assert for_module("nvidia_drm", (ModuleArg.parse("nvidia-drm.modeset=1"),)) == (
        ModuleArg("nvidia_drm", "modeset", "1"),)


def _tool(bin_dir, name, script):
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + script)
    (bin_dir / name).chmod(0o755)


def test_no_gpu_enodev_is_said_exactly(tmp_path, monkeypatch):
    """nvidia.ko's init without a GPU (nv.c nvidia_init_module): the kernel log says
    ``NVRM: No NVIDIA GPU found.`` and kmod's insmod reports ENODEV; seen for real in the
    qemu tier. Both texts below are what kmod and the kernel print."""
    import pytest

    from installer.base.errors import ModuleLoadError
    from installer.host.runner import Runner
    from installer.kmod.modules import load

    bin_dir = tmp_path / "bin"
    _tool(bin_dir, "insmod", 'echo "insmod: ERROR: could not insert module $1: No such device" >&2\n'
          "exit 1\n")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_text(
        "4,0,1000,-;nvidia-nvlink: Nvlink Core is being initialized, major device number 245\n"
        "4,1,2000,-;NVRM: No NVIDIA GPU found.\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{'/usr/bin:/bin'}")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/modules").write_text("")
    kernel = KernelState(tmp_path / "proc", tmp_path / "sys", tmp_path / "dev")
    ko = tmp_path / "nvidia.ko"
    ko.write_bytes(b"")
    with pytest.raises(ModuleLoadError) as err:
        load([ModuleLoad("nvidia", ko, (), ())], kernel, Runner(), modprobe_root=None)
    assert err.value.message == (
        "the driver built and the kernel accepted nvidia.ko, but no NVIDIA GPU is attached to "
        "this node (kernel: NVRM: No NVIDIA GPU found.)")
    assert err.value.context["kernel_log"] == ["[    0.002000] NVRM: No NVIDIA GPU found."]
    assert err.value.exit_code == 8


def test_real_nvidia_smi_failure_texts_get_their_hint():
    """Texts of Debian's nvidia-smi 535.261.03 (tests/realparts runs the binary itself)."""
    from installer.services.verify import smi_failure_hint

    assert "not loaded" in smi_failure_hint(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
        "that the latest NVIDIA driver is installed and running.\n")
    assert "another driver version" in smi_failure_hint(
        "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 535.261\n")
    assert "libnvidia-ml.so.1 does not resolve" in smi_failure_hint(
        "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that "
        "the NVIDIA Display Driver is properly installed and present in your system.\n")
    assert "no NVIDIA GPU" in smi_failure_hint("No devices were found\n")
    assert "dmesg" in smi_failure_hint("something new\n")


def _loaded_node(tmp_path, nvidia_params: list[str]) -> KernelState:
    """nvidia and nvidia_uvm loaded as on the real H100 node: no /sys/module/nvidia/parameters
    (nv-linux.h NV_MODULE_PARAMETER: module_param(x, int, 0)), the values in
    /proc/driver/nvidia/params (the fixture's copy of the node's 42 lines)."""
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    for name in ("nvidia", "nvidia_uvm"):
        (sys / "module" / name).mkdir(parents=True)
        (sys / "module" / name / "initstate").write_text("live\n")
    (sys / "module/nvidia_uvm/parameters").mkdir()
    (sys / "module/nvidia_uvm/parameters/uvm_disable_hmm").write_text("Y\n")
    (proc / "driver/nvidia").mkdir(parents=True)
    (proc / "driver/nvidia/params").write_text(driver_params_text(nvidia_params))
    (proc / "modules").write_text("nvidia_uvm 1830912 - - Live 0xffffffffc080c000 (O)\n"
                                  "nvidia 14299136 - - Live 0xffffffffc0400000 (O)\n")
    return KernelState(proc, sys, tmp_path / "dev")


def test_loaded_params_of_nvidia_come_from_proc_driver_nvidia_params(tmp_path):
    kernel = _loaded_node(tmp_path, ["NVreg_EnableGpuFirmware=0", 'NVreg_RegistryDwords="A=1"'])
    params = loaded_params(kernel, "nvidia")
    assert params is not None and len(params) == 42
    assert params["NVreg_ModifyDeviceFiles"] == "1" and params["NVreg_EnableGpuFirmware"] == "0"
    assert params["NVreg_RegistryDwords"] == "A=1" and params["NVreg_RmMsg"] == ""
    assert loaded_params(kernel, "nvidia-uvm") == {"uvm_disable_hmm": "Y"}
    assert loaded_params(kernel, "nvidia_modeset") is None  # not loaded


def test_module_args_read_back_as_applied_on_a_node_without_nvidia_sysfs_params(tmp_path):
    """Before: read from /sys/module/nvidia/parameters, which the real driver never has, so
    every nvidia option was reported as not applied."""
    kernel = _loaded_node(tmp_path, ["NVreg_EnableGpuFirmware=0", "NVreg_ResmanDebugLevel=-1",
                                     'NVreg_RegistryDwords="A=1"'])
    def args(module, *words):
        return tuple(ModuleArg.parse(f"{module}.{w}") for w in words)

    applied = args("nvidia", "NVreg_EnableGpuFirmware=0", "NVreg_ResmanDebugLevel=-1",
                   "NVreg_RegistryDwords=A=1", 'NVreg_RmMsg=""', "NVreg_DeviceFileMode=0x1b6")
    assert params_not_applied(kernel, "nvidia", applied) == []
    differ = args("nvidia", "NVreg_EnableGpuFirmware=1", "NVreg_NoSuchOption=1")
    assert params_not_applied(kernel, "nvidia", differ) == ["NVreg_EnableGpuFirmware=1",
                                                            "NVreg_NoSuchOption=1"]
    uvm = args("nvidia-uvm", "uvm_disable_hmm=1", "uvm_perf=1")
    assert params_not_applied(kernel, "nvidia_uvm", uvm) == ["uvm_perf=1"]  # bool Y is 1
    assert params_not_applied(kernel, "nvidia", uvm) == []  # another module's
