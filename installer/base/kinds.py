"""The kinds the installer names in its records, each one ``Literal`` type over the
spellings status.json, the metrics labels and the .cache record carry
(docs/contract.md): a type checker holds every use to them, and on disk they stay
the strings they always were. Imports nothing of the installer (the lowest layer)."""

from __future__ import annotations

from typing import Final, Literal, get_args

# The kernel modules' flavour: NVIDIA's open GPU kernel modules (kernel-open/ in the
# .run) or the proprietary ones (kernel/).
ModuleType = Literal["open", "proprietary"]
OPEN: Final = "open"
PROPRIETARY: Final = "proprietary"
MODULE_TYPES: Final[tuple[ModuleType, ...]] = get_args(ModuleType)
# What --kernel-module-type asks for: a flavour, or "auto" (gpus.choose_module_type decides).
ModuleTypeRequest = Literal["auto", "open", "proprietary"]
AUTO: Final = "auto"
MODULE_TYPE_REQUESTS: Final[tuple[ModuleTypeRequest, ...]] = get_args(ModuleTypeRequest)

# What a plan does (plan.Plan.kind; status.json "plan", the plan_ready event).
PlanKind = Literal["fresh", "staged", "cached", "preload", "bundle"]

# How a run ended (outcome.Outcome.outcome; status.json "outcome"). "unknown": a
# status.json read back without one we know (never written).
OutcomeKind = Literal["ok", "error", "interrupted", "uninstalled", "dry_run", "unknown"]
OUTCOME_KINDS: Final[tuple[OutcomeKind, ...]] = get_args(OutcomeKind)

# The daemon sidecars the DaemonSet may run (daemons.NAMES, --require-daemon).
DaemonName = Literal["fabricmanager", "persistenced"]
