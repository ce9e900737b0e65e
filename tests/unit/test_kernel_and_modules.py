import struct

from installer.kernel import KernelState, module_name, parse_proc_modules
from installer.modinfo import module_depends, read_modinfo, vermagic_release
from installer.modules import params_for, plan_loads, users
from installer.signing import cmdline_enforces_signatures, parse_lockdown

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


def _elf_with_modinfo(path, modinfo: bytes):
    """A minimal 64-bit ELF with .shstrtab and .modinfo sections."""
    shstr = b"\0.shstrtab\0.modinfo\0"
    data_off = 64
    shstr_off = data_off + len(modinfo)
    sh_off = shstr_off + len(shstr)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, sh_off, 0, 64, 0, 0, 64, 3, 1)
    null = bytes(64)
    sect_shstr = struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, shstr_off, len(shstr), 0, 0, 1, 0)
    sect_modinfo = struct.pack("<IIQQQQIIQQ", 11, 1, 2, 0, data_off, len(modinfo), 0, 0, 1, 0)
    path.write_bytes(header + modinfo + shstr + null + sect_shstr + sect_modinfo)


def test_read_modinfo_from_real_elf_layout(tmp_path):
    ko = tmp_path / "nvidia-drm.ko"
    _elf_with_modinfo(ko, b"version=550.54.14\0depends=drm,drm_kms_helper,nvidia-modeset\0"
                          b"vermagic=6.1.0-18-amd64 SMP preempt mod_unload modversions \0")
    info = read_modinfo(ko)
    assert vermagic_release(info) == "6.1.0-18-amd64"
    assert module_depends(info) == ["drm", "drm_kms_helper", "nvidia_modeset"]


def test_plan_loads_order_params_and_in_tree_deps(tmp_path):
    for stem, deps in (("nvidia-drm", "nvidia-modeset,drm_kms_helper"), ("nvidia", ""),
                       ("nvidia-uvm", "nvidia"), ("nvidia-modeset", "nvidia")):
        (tmp_path / f"{stem}.ko").write_text(
            f"FAKEKO1\nname={module_name(stem)}\ndepends={deps}\nvermagic=5.15 SMP\n")
    loads = plan_loads(tmp_path, ("nvidia.NVreg_EnableGpuFirmware=0", "nvidia-uvm.uvm_perf=1"))
    assert [m.name for m in loads] == ["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]
    assert loads[0].params == ("NVreg_EnableGpuFirmware=0",)
    assert loads[1].params == ("uvm_perf=1",)
    assert loads[3].in_tree_deps == ("drm_kms_helper",)
    assert params_for("nvidia_drm", ("nvidia-drm.modeset=1",)) == ("modeset=1",)


def _tool(bin_dir, name, script):
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + script)
    (bin_dir / name).chmod(0o755)


def test_no_gpu_enodev_is_said_exactly(tmp_path, monkeypatch):
    """nvidia.ko's init without a GPU (nv.c nvidia_init_module): the kernel log says
    ``NVRM: No NVIDIA GPU found.`` and kmod's insmod reports ENODEV; seen for real in the
    qemu tier. Both texts below are what kmod and the kernel print."""
    import pytest

    from installer.errors import ModuleLoadError
    from installer.modules import ModuleLoad, load
    from installer.runner import Runner

    bin_dir = tmp_path / "bin"
    _tool(bin_dir, "insmod", 'echo "insmod: ERROR: could not insert module $1: No such device" >&2\n'
          "exit 1\n")
    _tool(bin_dir, "dmesg", 'echo "[Mon Nov 23 11:00:00 2026] nvidia-nvlink: Nvlink Core is being '
          'initialized, major device number 245"\n'
          'echo "[Mon Nov 23 11:00:00 2026] NVRM: No NVIDIA GPU found."\n')
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
    assert err.value.context["kernel_log"][-1].endswith("NVRM: No NVIDIA GPU found.")
    assert err.value.exit_code == 8


def test_real_nvidia_smi_failure_texts_get_their_hint():
    """Texts of Debian's nvidia-smi 535.261.03 (tests/realparts runs the binary itself)."""
    from installer.verify import smi_failure_hint

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
