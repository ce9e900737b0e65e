import struct

from installer.kernel import (
    KernelState,
    cmdline_enforces_signatures,
    module_name,
    parse_lockdown,
    parse_proc_modules,
)
from installer.modinfo import module_depends, read_modinfo, vermagic_release
from installer.modules import params_for, plan_loads, users

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
