"""A plan is an ordered list of named steps; executing it logs each step and its duration
and collects what each returns (records/results.py) in plan order."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import field
from typing import TYPE_CHECKING

import structlog

from installer.base.dataclass import dataclass
from installer.base.errors import InstallerError
from installer.base.kinds import ModuleType, PlanKind
from installer.records.results import StepResult

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Step:
    name: str
    # Later steps read what it returns through ctx.results (run_step collects it); what it
    # changes on the node it notes in ctx.journal as it goes, for rollback.undo.
    run: Callable[[Context], StepResult | None]
    detail: str = ""  # what --dry-run prints: the URL, path or argv this step will use
    # A pre-flight check: reads the host and kernel, changes nothing, needs nothing an
    # earlier step made. --dry-run runs these, so it refuses what the real run refuses.
    check: bool = False
    # The results it reads with ctx.results.need, and those it may return: a Plan is
    # refused when built if a step needs a kind no earlier step gives.
    needs: tuple[type[StepResult], ...] = ()
    gives: tuple[type[StepResult], ...] = ()


@dataclass(frozen=True)
class Plan:
    """What a run does. The typed fields are what the run itself reads back (readiness,
    status, the unpinned warning); ``display`` is for people only (the plan_ready event,
    --dry-run): nothing may read a decision out of it."""

    kind: PlanKind
    steps: tuple[Step, ...]
    driver_version: str | None = None
    kernel_module_type: ModuleType | None = None
    driver_url: str | None = None  # the .run a fresh install downloads
    driver_sha256: str | None = None  # its pin, when one is known (flag or COS manifest)
    display: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """The step order the results need holds when the plan is made, not when it runs."""
        given: set[type[StepResult]] = set()
        for step in self.steps:
            missing = [kind.__name__ for kind in step.needs if kind not in given]
            if missing:
                raise ValueError(f"the {self.kind} plan runs {step.name} before any step "
                                 f"that gives {', '.join(missing)}")
            given.update(step.gives)

    @property
    def runs_downloaded_run(self) -> bool:
        """Whether this plan downloads NVIDIA's .run and runs it as root: a fresh install,
        and a staged one (the same fill, kept for the next boot). A cache hit, a preload
        and a bundle build run no .run they fetched for this node."""
        return self.kind in ("fresh", "staged")

    @property
    def summary(self) -> dict[str, object]:
        """The typed fields that are set and the display dict, for logs and --dry-run."""
        typed = {"driver_version": self.driver_version,
                 "kernel_module_type": self.kernel_module_type,
                 "driver_url": self.driver_url, "driver_sha256": self.driver_sha256}
        return {**{k: v for k, v in typed.items() if v is not None}, **self.display}

    def describe(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            **self.summary,
            "steps": [{"name": s.name, "detail": s.detail, "check": s.check}
                      for s in self.steps],
        }


@dataclass
class StepTiming:
    name: str
    duration_s: float


def run_step(step: Step, ctx: Context) -> StepResult | None:
    """Run one step; what it returns goes into ``ctx.results``, after the ones before it."""
    result = step.run(ctx)
    if result is not None:
        ctx.results.add(step.name, result)
    return result


def execute(plan: Plan, ctx: Context, timings: list[StepTiming], *,
            checks_only: bool = False) -> None:
    """Run the plan's steps in order (``checks_only``: its pre-flight checks, for --dry-run),
    collecting their results in that order."""
    for step in plan.steps:
        if checks_only and not step.check:
            continue
        log.debug("step_started", step=step.name)
        start = time.monotonic()
        try:
            run_step(step, ctx)
        except InstallerError as exc:
            exc.context.setdefault("step", step.name)
            raise
        finally:
            duration = time.monotonic() - start
            timings.append(StepTiming(step.name, round(duration, 3)))
        log.info("step_finished", step=step.name, duration_s=round(duration, 3))
