"""NVIDIA GPUs on the PCI bus, from sysfs, and which drivers they can use.

No ``lspci``: every PCI function is a directory under ``<sys>/bus/pci/devices``
with ``vendor``, ``device`` and ``class`` files (hex, ``0x10de`` is NVIDIA,
class ``0x03xxxx`` is a display controller). The device id names the model;
the model's architecture decides which driver branches support it and whether
the open kernel modules can (or must) be used.

Branch limits follow NVIDIA's support matrices: R470 is the last branch for
Kepler (K80), R580 the last for Maxwell, Pascal and Volta; each newer GPU
needs the branch it launched with (L4 and H100: R525, H200: R550, B200:
R570). The open kernel modules exist from R515, run only on Turing and
newer, are required on Blackwell and Grace Hopper, and are NVIDIA's default
for Turing+ from R560.
"""

from __future__ import annotations

import os
from dataclasses import field
from pathlib import Path

from installer.base import branches
from installer.base.branches import branch_of
from installer.base.dataclass import dataclass
from installer.base.errors import UsageError
from installer.base.fsutil import sorted_entries
from installer.base.kinds import AUTO, MODULE_TYPE_REQUESTS, OPEN, PROPRIETARY, ModuleType

NVIDIA_VENDOR = "0x10de"
DISPLAY_CLASS_PREFIX = "0x03"  # 0x0300 VGA, 0x0302 3D controller
OPEN_MODULES_SINCE = 515  # first branch shipping kernel-open
OPEN_DEFAULT_SINCE = 560  # nvidia-installer builds open by default (and has --kernel-module-type)
MODULE_TYPES = MODULE_TYPE_REQUESTS


@dataclass(frozen=True)
class Arch:
    name: str
    open_modules: str  # "no" (proprietary only), "yes" (either), "required"
    max_branch: int | None = None  # last branch supporting it


ARCHS = {a.name: a for a in (
    Arch("Kepler", "no", 470),
    Arch("Maxwell", "no", 580),
    Arch("Pascal", "no", 580),
    Arch("Volta", "no", 580),
    Arch("Turing", "yes"),
    Arch("Ampere", "yes"),
    Arch("Ada Lovelace", "yes"),
    Arch("Hopper", "yes"),
    Arch("Grace Hopper", "required"),
    Arch("Blackwell", "required"),
)}


@dataclass(frozen=True)
class Model:
    name: str
    arch: str
    min_branch: int  # first branch supporting it

    @property
    def max_branch(self) -> int | None:
        return ARCHS[self.arch].max_branch

    @property
    def open_modules(self) -> str:
        return ARCHS[self.arch].open_modules

    def branches(self) -> str:
        """``R525 or newer``, ``R470 or older``, ``R450 to R580``."""
        lo, hi = self.min_branch, self.max_branch
        if hi is None:
            return f"R{lo} or newer"
        return f"R{hi} or older" if lo <= 340 else f"R{lo} to R{hi}"


# PCI device id (vendor 0x10de) -> model: the data-centre GPUs clouds ship. Names and ids
# as in the "Compatible GPUs" table of NVIDIA/open-gpu-kernel-modules' README; for the
# later additions (H800 PCIe/NVL, RTX PRO 6000 Blackwell Server Edition, B300, GB300) the
# minimum branch is the first release whose table lists the id (530.41.03, 535.104.05,
# 575.57.08, 580.82.07).
MODELS: dict[str, Model] = {
    "0x102d": Model("Tesla K80", "Kepler", 340),
    "0x13f2": Model("Tesla M60", "Maxwell", 346),
    "0x1bb3": Model("Tesla P4", "Pascal", 375),
    "0x15f7": Model("Tesla P100-PCIE-12GB", "Pascal", 361),
    "0x15f8": Model("Tesla P100-PCIE-16GB", "Pascal", 361),
    "0x15f9": Model("Tesla P100-SXM2-16GB", "Pascal", 361),
    "0x1db1": Model("Tesla V100-SXM2-16GB", "Volta", 384),
    "0x1db4": Model("Tesla V100-PCIE-16GB", "Volta", 384),
    "0x1db5": Model("Tesla V100-SXM2-32GB", "Volta", 384),
    "0x1db6": Model("Tesla V100-PCIE-32GB", "Volta", 384),
    "0x1df6": Model("Tesla V100S-PCIE-32GB", "Volta", 418),
    "0x1eb8": Model("Tesla T4", "Turing", 410),
    "0x20b0": Model("NVIDIA A100-SXM4-40GB", "Ampere", 450),
    "0x20b2": Model("NVIDIA A100-SXM4-80GB", "Ampere", 450),
    "0x20b5": Model("NVIDIA A100 80GB PCIe", "Ampere", 450),
    "0x20f1": Model("NVIDIA A100-PCIE-40GB", "Ampere", 450),
    "0x20b7": Model("NVIDIA A30", "Ampere", 460),
    "0x2235": Model("NVIDIA A40", "Ampere", 460),
    "0x2236": Model("NVIDIA A10", "Ampere", 460),
    "0x2237": Model("NVIDIA A10G", "Ampere", 460),
    "0x25b6": Model("NVIDIA A2", "Ampere", 470),
    "0x27b8": Model("NVIDIA L4", "Ada Lovelace", 525),
    "0x26b5": Model("NVIDIA L40", "Ada Lovelace", 525),
    "0x26b9": Model("NVIDIA L40S", "Ada Lovelace", 535),
    "0x2330": Model("NVIDIA H100 80GB HBM3", "Hopper", 525),
    "0x2331": Model("NVIDIA H100 PCIe", "Hopper", 525),
    "0x2321": Model("NVIDIA H100 NVL", "Hopper", 535),
    "0x2324": Model("NVIDIA H800", "Hopper", 525),
    "0x2322": Model("NVIDIA H800 PCIe", "Hopper", 530),
    "0x233a": Model("NVIDIA H800 NVL", "Hopper", 535),
    "0x2342": Model("NVIDIA GH200 480GB", "Grace Hopper", 535),
    "0x2335": Model("NVIDIA H200", "Hopper", 550),
    "0x233b": Model("NVIDIA H200 NVL", "Hopper", 550),
    "0x2901": Model("NVIDIA B200", "Blackwell", 570),
    "0x2941": Model("NVIDIA GB200", "Blackwell", 570),
    "0x2bb5": Model("NVIDIA RTX PRO 6000 Blackwell Server Edition", "Blackwell", 575),
    "0x3182": Model("NVIDIA B300 SXM6 AC", "Blackwell", 580),
    "0x31c2": Model("NVIDIA GB300", "Blackwell", 580),
}

# The GPUs of NVIDIA's Grace superchips, each joined to a Grace CPU by NVLink-C2C (its
# memory coherent with the CPU's; the node is aarch64): GH200, GB200, GB300.
GRACE_PARTS = frozenset({"0x2342", "0x2941", "0x31c2"})
# How the driver exposes a Grace part's memory: "driver" (CDMM, coherent driver-based memory
# management: not onlined to the kernel as a NUMA node) or "numa" (unset: the default from
# 580.65.06 to at least 595.45.04). NVIDIA/open-gpu-kernel-modules kernel-open/nvidia/
# nv-reg.h:454-471 and 1075 (a string option, NULL by default), os-registry.c:335-344 ("driver" implies
# EnableUserNUMAManagement=0); first in tag 580.65.06 (git log -S CoherentGPUMemoryMode).
CDMM_PARAM = "NVreg_CoherentGPUMemoryMode"
CDMM_SINCE = (580, 65, 6)


# --gpu-model (install --dry-run): a model's short name is its table name without the
# vendor prefix, up to the first space or dash (H100, A100, T4, GB200); the first id of the
# table with that short name is the one assumed (H100: the SXM part, 0x2330).
ASSUMED_ADDRESS = "(--gpu-model)"  # where messages name an assumed GPU's PCI address
_PREFIXES = ("nvidia ", "tesla ")


def _bare(name: str) -> str:
    low = name.strip().casefold()
    return next((low[len(p):] for p in _PREFIXES if low.startswith(p)), low)


def short_names() -> dict[str, str]:
    """Short model name (upper case) -> the device id it stands for, in table order."""
    found: dict[str, str] = {}
    for device_id, model in MODELS.items():
        short = _bare(model.name).replace("-", " ").split()[0].upper()
        found.setdefault(short, device_id)
    return found


def _device_id(text: str) -> str | None:
    """``0x2330`` (as sysfs writes a device id) or ``10de:2330`` (as lspci -n), else None:
    a bare ``b200`` or ``a100`` is a model's name, not hex."""
    low = text.strip().casefold()
    if not low.startswith(("0x", "10de:")):
        return None
    low = low.removeprefix("10de:").removeprefix("0x")
    if len(low) == 4 and all(c in "0123456789abcdef" for c in low):
        return f"0x{low}"
    return None


def assumed_gpu(requested: str) -> PciGpu:
    """The GPU --gpu-model names, as the PCI scan would find it: a table name (with or
    without its NVIDIA/Tesla prefix) or a short name, any case, or a PCI device id (one
    the table lacks is an unknown GPU, as the scan finds it). UsageError otherwise."""
    device_id = _device_id(requested)
    if device_id is None:
        wanted = _bare(requested)
        device_id = next((i for i, m in MODELS.items() if _bare(m.name) == wanted),
                         None) or short_names().get(wanted.upper())
    if device_id is None:
        raise UsageError(
            f"--gpu-model {requested.strip()[:64]!r} is not a GPU model this installer knows",
            hint=f"use one of {', '.join(short_names())}, or a PCI device id such as 0x2330 "
            "(the GPU's `cat /sys/bus/pci/devices/<address>/device`)")
    return PciGpu(ASSUMED_ADDRESS, device_id, "0x030200", model=MODELS.get(device_id))


def grace_parts(gpus: list[PciGpu] | tuple[PciGpu, ...]) -> list[PciGpu]:
    return [g for g in gpus if g.device_id in GRACE_PARTS]


def has_cdmm_option(version: str) -> bool:
    """Whether driver ``version``'s nvidia.ko has NVreg_CoherentGPUMemoryMode (580.65.06+)."""
    try:
        return tuple(int(p) for p in version.split(".")[:3]) >= CDMM_SINCE
    except ValueError:
        return False


# Tested versions of the branches a GPU may have to fall back to when the
# default driver does not support it (newest first).
# Newest first: the current long-term release (branches.py), then older branches for GPUs
# or COS builds that need them (R570/R535 are past their end of life: a warning says so).
FALLBACK_VERSIONS = (branches.RECOMMENDED_VERSION, "570.133.20", "535.230.02", "470.256.02")


@dataclass(frozen=True)
class PciGpu:
    address: str  # 0000:00:04.0
    device_id: str  # 0x27b8
    pci_class: str
    subsystem_device: str | None = None
    model: Model | None = None
    # The driver it is bound to: the basename of its sysfs ``driver`` link (the kernel
    # makes it on bind, drivers/base/bus.c); None while unbound. "vfio-pci": passed
    # through to a VM, not this host's nvidia driver's.
    driver: str | None = None

    @property
    def name(self) -> str:
        return self.model.name if self.model else f"unknown NVIDIA GPU (PCI id 10de:{self.device_id[2:]})"

    def describe(self) -> str:
        if self.model is None:
            return f"{self.name} at {self.address}"
        return f"{self.name} at {self.address} ({self.model.arch}, {self.model.branches()})"

    def to_dict(self) -> dict[str, object]:
        return {
            "address": self.address,
            "device_id": self.device_id,
            "name": self.name,
            "arch": self.model.arch if self.model else None,
            "min_branch": self.model.min_branch if self.model else None,
            "max_branch": self.model.max_branch if self.model else None,
        }


def read_attr(path: Path) -> str:
    """A sysfs attribute, stripped and lower-cased ("" if unreadable)."""
    try:
        return path.read_text(errors="replace").strip().lower()
    except OSError:
        return ""


def nvidia_functions(sys_dir: Path, class_prefix: str) -> list[tuple[Path, str]]:
    """NVIDIA's PCI functions under ``<sys_dir>/bus/pci/devices`` whose class starts with
    ``class_prefix``, by address: each one's sysfs dir and class."""
    found = []
    for dev in sorted_entries(Path(sys_dir) / "bus/pci/devices"):
        if read_attr(dev / "vendor") != NVIDIA_VENDOR:
            continue
        pci_class = read_attr(dev / "class")
        if pci_class.startswith(class_prefix):
            found.append((dev, pci_class))
    return found


def scan(sys_dir: Path) -> list[PciGpu]:
    """NVIDIA display controllers under ``<sys_dir>/bus/pci/devices``, by address (not the
    NVSwitch bridges or audio functions)."""
    found = []
    for dev, pci_class in nvidia_functions(sys_dir, DISPLAY_CLASS_PREFIX):
        device_id = read_attr(dev / "device")
        found.append(PciGpu(dev.name, device_id, pci_class,
                            read_attr(dev / "subsystem_device") or None, MODELS.get(device_id),
                            bound_driver(dev)))
    return found


def bound_driver(dev: Path) -> str | None:
    """The driver a PCI function is bound to (its ``driver`` link's target), or None."""
    try:
        return os.readlink(dev / "driver").rstrip("/").rsplit("/", 1)[-1] or None
    except OSError:
        return None


def bound_elsewhere(gpu: PciGpu) -> bool:
    """Bound to a driver other than nvidia (vfio-pci for passthrough): not the host's GPU."""
    return gpu.driver not in (None, "nvidia")


def unknown(found: list[PciGpu]) -> list[str]:
    """One warning per NVIDIA GPU missing from the table (its branch limits are unknown)."""
    return [f"unknown NVIDIA GPU 10de:{g.device_id.removeprefix('0x')} at {g.address}: its "
            "supported driver branches are not known here, none are enforced" for g in found
            if g.model is None]


def branch_problems(gpus: list[PciGpu], version: str) -> list[str]:
    """Why ``version`` cannot drive these GPUs (empty: it can, or we cannot tell)."""
    branch = branch_of(version)
    if branch is None:
        return []
    problems = []
    for gpu in gpus:
        m = gpu.model
        if m is None:
            continue
        if branch < m.min_branch:
            problems.append(f"driver {version} (R{branch}) is too old for {gpu.name} at "
                            f"{gpu.address}: it needs {m.branches()}")
        elif m.max_branch is not None and branch > m.max_branch:
            problems.append(f"driver {version} (R{branch}) is too new for {gpu.name} at "
                            f"{gpu.address}: {m.arch} GPUs need {m.branches()}")
    return problems


def allowed_branches(gpus: list[PciGpu]) -> tuple[int, int | None]:
    """The branch range every known GPU here supports: (lowest, highest or None)."""
    known = [g.model for g in gpus if g.model]
    lo = max((m.min_branch for m in known), default=0)
    highs = [m.max_branch for m in known if m.max_branch is not None]
    return lo, (min(highs) if highs else None)


def describe_range(lo: int, hi: int | None) -> str:
    if hi is None:
        return f"R{lo} or newer"
    if hi < lo:
        return "none (these GPUs have no branch in common)"
    return f"R{lo} to R{hi}"


def pick_default(gpus: list[PciGpu], default_version: str) -> tuple[str, str | None]:
    """The default version, or the newest tested fallback these GPUs support.

    Returns (version, why it was changed or None).
    """
    if not branch_problems(gpus, default_version):
        return default_version, None
    for candidate in FALLBACK_VERSIONS:
        if not branch_problems(gpus, candidate):
            names = ", ".join(sorted({g.name for g in gpus if g.model}))
            return candidate, (f"the default driver {default_version} does not support {names}; "
                               f"using {candidate} instead")
    return default_version, None


@dataclass(frozen=True)
class ModuleChoice:
    module_type: ModuleType
    reason: str
    problems: list[str] = field(default_factory=list)


def choose_module_type(gpus: list[PciGpu], version: str, requested: str = AUTO) -> ModuleChoice:
    """Open or proprietary kernel modules for these GPUs and driver version.

    ``auto``: proprietary when any GPU predates Turing or the branch predates the open
    modules; open when a GPU requires it; otherwise NVIDIA's own default for the
    branch (open from R560). An explicit choice the hardware cannot use is a problem.
    """
    if requested not in MODULE_TYPES:
        raise UsageError(f"unknown kernel module type {requested!r}",
                         hint=f"use one of: {', '.join(MODULE_TYPES)}")
    branch = branch_of(version)
    known = [(g, g.model) for g in gpus if g.model]
    legacy = [(g, model) for g, model in known if model.open_modules == "no"]
    need_open = [(g, model) for g, model in known if model.open_modules == "required"]
    too_old_for_open = branch is not None and branch < OPEN_MODULES_SINCE
    problems: list[str] = []

    if requested == OPEN:
        problems += [f"{g.name} at {g.address} ({model.arch}) cannot use the open kernel "
                     "modules (they need Turing or newer)" for g, model in legacy]
        if too_old_for_open:
            problems.append(f"driver {version} predates the open kernel modules "
                            f"(R{OPEN_MODULES_SINCE}+)")
        return ModuleChoice(OPEN, "requested", problems)
    if requested == PROPRIETARY:
        problems += [f"{g.name} at {g.address} ({model.arch}) needs the open kernel "
                     "modules" for g, model in need_open]
        if branch is not None and branch >= branches.OPEN_ONLY_SINCE:
            problems.append(f"driver {version} (R{branch}) has no proprietary kernel modules: "
                            f"NVIDIA ships only the open ones from R{branches.OPEN_ONLY_SINCE}")
        return ModuleChoice(PROPRIETARY, "requested", problems)

    if legacy and need_open:
        return ModuleChoice(PROPRIETARY, "mixed GPUs",
                            [f"{legacy[0][0].name} needs the proprietary modules and "
                             f"{need_open[0][0].name} the open ones: no single driver fits both"])
    if legacy:
        return ModuleChoice(PROPRIETARY, f"{legacy[0][1].arch} GPU ({legacy[0][0].name})")
    if need_open:
        problems = ([f"{need_open[0][0].name} needs the open kernel modules, which driver "
                     f"{version} predates"] if too_old_for_open else [])
        return ModuleChoice(OPEN, f"{need_open[0][1].arch} GPU ({need_open[0][0].name})",
                            problems)
    if too_old_for_open:
        return ModuleChoice(PROPRIETARY, f"R{branch} predates the open modules")
    if branch is not None and branch >= OPEN_DEFAULT_SINCE:
        return ModuleChoice(OPEN, f"NVIDIA's default from R{OPEN_DEFAULT_SINCE}")
    return ModuleChoice(PROPRIETARY, f"NVIDIA's default before R{OPEN_DEFAULT_SINCE}")


@dataclass(frozen=True)
class Gpu:
    """A GPU as nvidia-smi reports it (verify), beside the PCI view above."""

    name: str
    driver_version: str
    bus_id: str
