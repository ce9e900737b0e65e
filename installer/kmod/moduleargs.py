"""Kernel module parameters the operator asks for (``--module-arg`` / NVIDIA_MODULE_ARGS):
``MODULE.PARAM=VALUE``, parsed and checked once, when the command starts. Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable

from installer.base.dataclass import dataclass
from installer.kmod.kernel import module_name as kernel_module_name

# A module's name as the kernel keeps it (MODULE_NAME_LEN: 64 - sizeof(unsigned long));
# '-' in a file name reads as '_' (kernel/module: the name is the file's, dashes mapped).
_MODULE = re.compile(r"[A-Za-z0-9_-]{1,55}")
# A parameter is a C identifier (module_param(name, ...): include/linux/moduleparam.h).
_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# insmod takes each parameter as one word, and the readiness file lists them separated
# by spaces: no whitespace or control character inside a value.
_BAD_VALUE_CHAR = re.compile(r"[\s\x00-\x1f\x7f]")
EXAMPLE = "nvidia.NVreg_EnableGpuFirmware=0"


@dataclass(frozen=True)
class ModuleArg:
    module: str  # the kernel's name for it: nvidia_uvm
    param: str  # e.g. NVreg_EnableGpuFirmware
    value: str  # as insmod takes it (quotes included)

    @classmethod
    def parse(cls, text: str, modules: Iterable[str] = ()) -> ModuleArg:
        """``MODULE.PARAM=VALUE``; ValueError saying what is wrong. ``modules``: the
        modules the installer loads (file stems), when the module must be one of them."""
        mod, dot, rest = text.partition(".")
        param, eq, value = rest.partition("=")
        if _BAD_VALUE_CHAR.search(text):
            raise ValueError(f"{text!r} has whitespace or a control character in it: one "
                             f"MODULE.PARAM=VALUE per argument, e.g. {EXAMPLE}")
        if not (dot and eq):
            raise ValueError(f"{text!r} is not MODULE.PARAM=VALUE, e.g. {EXAMPLE}")
        if not _MODULE.fullmatch(mod):
            raise ValueError(f"{text!r}: {mod!r} is not a module name")
        if not _PARAM.fullmatch(param):
            raise ValueError(f"{text!r}: {param!r} is not a parameter name")
        known = [kernel_module_name(m) for m in modules]
        if known and kernel_module_name(mod) not in known:
            raise ValueError(f"{text!r} is for module {mod!r}, which the installer never "
                             f"loads: use one of {', '.join(known)}")
        return cls(kernel_module_name(mod), param, value)

    def __str__(self) -> str:
        return f"{self.module}.{self.param}={self.value}"

    @property
    def insmod_word(self) -> str:
        """``PARAM=VALUE``, as insmod takes it."""
        return f"{self.param}={self.value}"


def for_module(module: str, args: Iterable[ModuleArg]) -> tuple[ModuleArg, ...]:
    """The arguments of ``module`` (a file stem or the kernel's name)."""
    name = kernel_module_name(module)
    return tuple(a for a in args if a.module == name)


def parse_listed(text: str) -> tuple[ModuleArg, ...] | None:
    """Arguments listed space-separated (the readiness file's NVIDIA_MODULE_ARGS); None
    when one of them is not an argument (a file something else wrote)."""
    try:
        return tuple(ModuleArg.parse(word) for word in text.split())
    except ValueError:
        return None
