"""ModuleArg: MODULE.PARAM=VALUE parsed once, checked for what insmod and the readiness
file can carry (issue 32 item 4, issue 33 item 7)."""

from __future__ import annotations

import pytest

from installer.kmod.moduleargs import ModuleArg, for_module, parse_listed
from installer.records import readiness

LOADED = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm")


@pytest.mark.parametrize("text, parsed", [
    ("nvidia.NVreg_EnableGpuFirmware=0", ("nvidia", "NVreg_EnableGpuFirmware", "0")),
    ("nvidia-uvm.uvm_disable_hmm=1", ("nvidia_uvm", "uvm_disable_hmm", "1")),  # kernel's name
    ('nvidia.NVreg_RegistryDwords="A=1;B=2"', ("nvidia", "NVreg_RegistryDwords", '"A=1;B=2"')),
    ("nvidia.NVreg_RmMsg=", ("nvidia", "NVreg_RmMsg", "")),
])
def test_good_arguments(text, parsed):
    arg = ModuleArg.parse(text, LOADED)
    assert (arg.module, arg.param, arg.value) == parsed
    assert ModuleArg.parse(str(arg)) == arg
    assert arg.insmod_word == f"{parsed[1]}={parsed[2]}"


@pytest.mark.parametrize("text, why", [
    ("nvidia.NVreg_X=1\nnvidia.NVreg_Y=2", "whitespace or a control character"),
    ("nvidia.NVreg_X=a b", "whitespace or a control character"),
    ("nvidia.NVreg_X=a\x1bb", "whitespace or a control character"),
    ("nvidia", "is not MODULE.PARAM=VALUE"),
    ("nvidia.NVreg_X", "is not MODULE.PARAM=VALUE"),
    ("nvidia.=1", "'' is not a parameter name"),
    ("nvidia.1x=1", "'1x' is not a parameter name"),
    (".NVreg_X=1", "'' is not a module name"),
    ("../nvidia.x=1", "is not a module name"),
    ("nvidia_peermem.x=1", "which the installer never loads"),
])
def test_bad_arguments_say_what_is_wrong(text, why):
    with pytest.raises(ValueError) as exc:
        ModuleArg.parse(text, LOADED)
    assert why in str(exc.value) and "\n" not in str(exc.value)


def test_the_readiness_list_round_trips():
    args = tuple(ModuleArg.parse(t) for t in ("nvidia.NVreg_RegistryDwords=A=1;B=2",
                                              "nvidia-uvm.uvm_perf=1"))
    fields = readiness.parse(readiness.format_fields(readiness.ready_fields(
        readiness.ReadyDriver(driver_version="580.82.07", plan="fresh", module_type="open",
                              gpu_count=1, persistence_mode="off", module_args=args),
        install_dir_host=readiness.READY_HOST_PATH, kernel_release="6.8",
        installer_version="t")))
    assert readiness.loaded_module_args(fields) == args
    assert parse_listed("nvidia.x=1 something-else") is None  # not ours: unknown
    assert for_module("nvidia-uvm", args) == args[1:]
