"""Which modules a COS install uses: prebuilt (open, signed), precompiled (signed
proprietary) or compiled. Pure: CosFlow probes the node and the build (``Probe``), then
``choose`` decides (``Choice``), then the flow lists the steps for it."""

from __future__ import annotations

import dataclasses

from installer.base.dataclass import dataclass
from installer.base.kinds import OPEN, PROPRIETARY, ModuleType
from installer.host import gpus
from installer.kmod.signing import SigningPolicy
from installer.records.cachekey import ModuleSource


@dataclass(frozen=True)
class ModuleDecision:
    use_prebuilt: bool
    compiled_type: ModuleType  # what a compile builds
    notes: tuple[str, ...] = ()


def decide_modules(gpus_found: list[gpus.PciGpu], version: str, requested: str,
                   prebuilt_available: bool) -> ModuleDecision:
    """Prebuilt (open, signed) modules when the build has them, every GPU here can use
    the open modules and they were not refused; else what a compile builds
    (the shared choice: the GPUs' needs, then NVIDIA's default for the branch).

    COS prefers its prebuilt modules whenever they can work, as Google's
    installer does; ``--kernel-module-type proprietary`` opts out of them.
    """
    notes: list[str] = []
    legacy = [(g, g.model) for g in gpus_found if g.model and g.model.open_modules == "no"]
    use_prebuilt = prebuilt_available and requested != PROPRIETARY and not legacy
    if prebuilt_available and legacy:
        gpu, model = legacy[0]
        notes.append(f"prebuilt modules are open modules, which {gpu.name} "
                     f"({model.arch}) cannot use")
    if prebuilt_available and requested == PROPRIETARY:
        notes.append("prebuilt modules are open modules: not used (--kernel-module-type "
                      "proprietary)")
    choice = gpus.choose_module_type(gpus_found, version, requested)
    return ModuleDecision(use_prebuilt, choice.module_type, tuple(notes))


def proprietary_allowed(gpus_found: list[gpus.PciGpu], requested: str) -> bool:
    """The proprietary modules (all the precompiled .run has) can drive these GPUs and were
    not refused (Blackwell and Grace Hopper need the open ones)."""
    return requested != OPEN and not any(
        g.model and g.model.open_modules == "required" for g in gpus_found)


@dataclass(frozen=True)
class Probe:
    """What the decision reads: this node's GPUs and signature policy, what was asked
    for, and which module sources the build publishes."""

    gpus: tuple[gpus.PciGpu, ...]
    requested_type: str  # --kernel-module-type: auto | open | proprietary
    policy: SigningPolicy
    prebuilt_available: bool  # nvidia-drivers-<V>.tgz
    # extensions/gpu/NVIDIA-Linux-x86_64-<V>-custom.run and its signatures (probed only
    # when precompiled_wanted says they could be used)
    precompiled_available: bool = False


@dataclass(frozen=True)
class Choice:
    source: ModuleSource
    compiled_type: ModuleType  # what nvidia-installer builds or installs user space for
    notes: tuple[str, ...] = ()
    blocked: bool = False  # refused with exit 10 by the signing check

    @property
    def signed(self) -> bool:
        """Modules that come signed: the NVIDIA installer installs user space only."""
        return self.source is not ModuleSource.COMPILED

    @property
    def module_type(self) -> ModuleType:
        """The type of the modules that load."""
        loads: dict[ModuleSource, ModuleType] = {ModuleSource.PREBUILT: OPEN,
                                                 ModuleSource.PRECOMPILED: PROPRIETARY}
        return loads.get(
            self.source, self.compiled_type)


def precompiled_wanted(found: tuple[gpus.PciGpu, ...], requested: str, policy: SigningPolicy,
                       use_prebuilt: bool) -> bool:
    """Whether Google's precompiled proprietary driver would be used if the build has it.

    Only where it is needed: the kernel loads only signed modules and the build's signed
    open modules are missing or cannot serve these GPUs (pre-Turing). Where unsigned
    modules load, compiling stays the default: it builds whichever module type the GPUs
    need (the custom .run is proprietary only), from the build's own headers, and costs
    no probes of Google-only artifacts on every fresh install. As cos-gpu-installer v2
    (install.go L313: no prebuilt modules -> the precompiled .run), for any branch, unless
    these GPUs or the user need the open modules."""
    return (not use_prebuilt and policy.enforced and not policy.loadpin_blocks
            and proprietary_allowed(list(found), requested))


def choose(probe: Probe, version: str) -> Choice:
    """The modules a fresh install of ``version`` uses, and whether signing blocks it."""
    decision = decide_modules(list(probe.gpus), version, probe.requested_type,
                              probe.prebuilt_available)
    precompiled = probe.precompiled_available and precompiled_wanted(
        probe.gpus, probe.requested_type, probe.policy, decision.use_prebuilt)
    source = (ModuleSource.PREBUILT if decision.use_prebuilt
              else ModuleSource.PRECOMPILED if precompiled else ModuleSource.COMPILED)
    chosen = Choice(source, decision.compiled_type, decision.notes)
    blocked = probe.policy.loadpin_blocks or (probe.policy.enforced and not chosen.signed)
    return dataclasses.replace(chosen, blocked=blocked)
