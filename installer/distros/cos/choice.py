"""Which modules a COS install uses: prebuilt (open, signed), precompiled (signed
proprietary) or compiled; and the branch aliases to fall back to for old GPUs."""

from __future__ import annotations

from dataclasses import dataclass

FLAVOR_PREBUILT = "prebuilt-open"
FLAVOR_PRECOMPILED = "precompiled-signed"  # proprietary modules linked here, Google-signed


@dataclass(frozen=True)
class ModuleDecision:
    use_prebuilt: bool
    compiled_type: str  # what a compile builds: "open" or "proprietary"
    notes: tuple[str, ...] = ()


def decide_modules(gpus_found: list, version: str, requested: str,
                   prebuilt_available: bool) -> ModuleDecision:
    """Prebuilt (open, signed) modules when the build has them, every GPU here can use
    the open modules and the open flavour was not refused; else what a compile builds
    (the shared choice: the GPUs' needs, then NVIDIA's default for the branch).

    COS prefers its prebuilt modules whenever they can work, as Google's
    installer does; ``--kernel-module-type proprietary`` opts out of them.
    """
    from installer import gpus

    notes: list[str] = []
    legacy = [g for g in gpus_found if g.model and g.model.open_modules == "no"]
    use_prebuilt = prebuilt_available and requested != "proprietary" and not legacy
    if prebuilt_available and legacy:
        notes.append(f"prebuilt modules are open modules, which {legacy[0].name} "
                     f"({legacy[0].model.arch}) cannot use")
    if prebuilt_available and requested == "proprietary":
        notes.append("prebuilt modules are open modules: not used (--kernel-module-type "
                      "proprietary)")
    choice = gpus.choose_module_type(gpus_found, version, requested)
    return ModuleDecision(use_prebuilt, choice.module_type, tuple(notes))


def proprietary_allowed(gpus_found: list, requested: str) -> bool:
    """The proprietary modules (all the precompiled .run has) can drive these GPUs and were
    not refused (Blackwell and Grace Hopper need the open ones)."""
    return requested != "open" and not any(
        g.model and g.model.open_modules == "required" for g in gpus_found)


def flavor_module_type(flavor: str | None) -> str | None:
    if flavor == FLAVOR_PRECOMPILED:
        return "proprietary"
    return flavor.rsplit("-", 1)[-1] if flavor and flavor.count("-") == 1 else None
