"""What a distro's flow provides on top of its facts (``base.Distro``): a driver version,
a cache key and a plan; and the plan skeleton every flow shares (a cache hit, a fresh
install, one staged for the next boot)."""

from __future__ import annotations

import abc
import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import structlog

from installer.base.dataclass import dataclass
from installer.base.kinds import ModuleType
from installer.distros.base import Distro
from installer.plan import Plan, Step
from installer.records import cache
from installer.records.cache import CacheKey
from installer.records.results import BundleStaged, InUse, NextBootTaken, StepResult
from installer.settings import Settings
from installer.steps import activate, checks, next_boot, staging

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)


class Flow(abc.ABC):
    """How a distro installs (``flows.FLOWS`` holds each way, by name): its plans, over
    the facts of the distro it serves (``self.distro``)."""

    def __init__(self, distro: type[Distro]) -> None:
        self.distro = distro

    @property
    def title(self) -> str:
        return self.distro.title

    def unpinned_artifacts(self, settings: Settings) -> str | None:
        return self.distro.unpinned_artifacts(settings)

    def check_settings(self, ctx: Context) -> None:
        """Refuse another distro's options that mean nothing on this OS (UsageError),
        before the lock."""
        for options in ctx.settings.distro_options:
            refused = None if isinstance(options, self.distro.options or ()) else (
                options.refused_on(self.title))
            if refused is not None:
                raise refused

    @abc.abstractmethod
    def driver_version(self, ctx: Context) -> str:
        """The concrete driver version to install (aliases resolved)."""

    @abc.abstractmethod
    def cache_key(self, ctx: Context, version: str) -> CacheKey: ...

    @abc.abstractmethod
    def plan(self, ctx: Context) -> Plan: ...

    def cache_hit(self, ctx: Context, key: CacheKey) -> bool:
        """A usable cached install: the record matches and its files are intact."""
        if ctx.settings.force:
            log.info("cache_skipped", reason="--force")
            return False
        record = ctx.node.installed
        if record is None:
            log.info("cache_miss", reason="no .cache record", path=str(ctx.install.cache_file))
            return False
        reason = record.mismatch(key) or cache.check_files(record, ctx.install.root)
        if reason:
            log.info("cache_miss", reason=reason)
            return False
        log.info("cache_hit", key=key.describe())
        return True

def cached_plan(ctx: Context, version: str, check_gpus: Step, *, module_type: ModuleType | None,
                display: dict[str, object]) -> Plan:
    """A cache hit in any distro: check the GPUs, then load and verify what is installed
    (and drop a tree staged for the next boot: this version is the one wanted now)."""
    loading = () if ctx.settings.install_only else (checks.check_module_loading(version),)
    return Plan("cached", (check_gpus, *loading, next_boot.drop_next_boot(version),
                           *activate.load_cached(ctx, version)),
                driver_version=version, kernel_module_type=module_type, display=display)


@dataclass(frozen=True)
class Wanted:
    """What a fresh install puts in place: the plan's typed facts and its cache key."""

    version: str
    key: CacheKey
    module_type: ModuleType
    driver_url: str
    driver_sha256: str | None = None


@dataclass(frozen=True)
class DistroSteps:
    """A distro's own steps in the shared fresh-install skeleton (``fresh_plan``)."""

    check_gpus: Step
    check_signing: Step
    build: Sequence[Step]  # fill the staging dir (after ``before_staging``)
    before_staging: Sequence[Step] = ()
    prebuilt: Step | None = None  # a fleet's bundle, tried first
    load: Step | None = None  # loads the staged modules (None: the shared step)


def fresh_plan(ctx: Context, wanted: Wanted, own: DistroSteps,
               display: dict[str, object]) -> Plan:
    """A fresh install in any distro: every check before any download, then the distro's
    own steps that fill the staging dir, then load, verify, swap in and record.

    The staging dir is filled by the first that can: the tree staged for the next boot
    (``take_next_boot``: after the reboot, no download, no compile), then ``prebuilt`` (a
    fleet's bundle, ``--prebuilt-url``), then the distro's headers and build. The signing
    check is skipped only for a bundle (a signed bundle loads where our own unsigned build
    would be refused).

    With ``--when-in-use stage`` and another driver loaded and in use, the plan is
    ``staged``: the same fill and checks, then the tree is kept for the next boot and the
    running driver verified, untouched (records/staged_driver.py). ``load``: the distro's own step
    loading the staged modules (None: the shared one)."""
    version, key = wanted.version, wanted.key
    prebuilt, check_signing = own.prebuilt, own.check_signing
    in_use = _in_use_to_stage(ctx, version)
    # Without a bundle the signing check goes first, before any download; with one, after
    # it (whether the bundle is signed decides).
    early = () if prebuilt else (check_signing,)
    note = " (only without a prebuilt bundle)" if prebuilt else ""
    fill = (
        staging.prepare_staging(),
        next_boot.take_next_boot(key),
        *((_unless_filled(prebuilt), _unless_filled(check_signing, note)) if prebuilt else ()),
        *(_unless_filled(s, note) for s in (*own.before_staging, *own.build)),
    )
    typed = functools.partial(Plan, driver_version=version, kernel_module_type=wanted.module_type,
                              driver_url=wanted.driver_url, driver_sha256=wanted.driver_sha256)
    # A load is needed now, or at the next boot for a staged version: a kernel refusing
    # every load (kernel.modules_disabled=1, usually the node image's) stops both first.
    loading = () if ctx.settings.install_only else (checks.check_module_loading(version),)
    if in_use is not None:
        return typed("staged", (
            own.check_gpus, *loading, *early, *fill, *next_boot.stage_for_next_boot(key, in_use),
        ), display={**display, "running_driver_version": in_use.running_version})
    return typed("fresh", (
        own.check_gpus, *loading, *early, checks.check_loaded_driver(version), *fill,
        *activate.activate_staged(ctx, version, key, own.load),
    ), display=display)


def _in_use_to_stage(ctx: Context, version: str) -> InUse | None:
    """The other driver to leave running: when --when-in-use stage asks to wait for it, or
    whenever the kernel can unload nothing before a reboot (no CONFIG_MODULE_UNLOAD:
    failing would change nothing a drain could fix)."""
    node = ctx.node  # held_by: read only when the settings may stage (detect.probe)
    running, held = node.loaded_driver, node.held_by
    if ctx.settings.install_only or running is None or running == version or not held:
        return None
    found = InUse(running, held)
    log.info("driver_in_use", running=found.running_version, holders=found.holders,
             wanted=version, when_in_use=ctx.settings.when_in_use)
    return found


def _unless_filled(step: Step, note: str = "") -> Step:
    """``step`` only while nothing has filled the staging dir yet (``note``: for --dry-run)."""

    def run(ctx: Context) -> StepResult | None:
        bundle = ctx.results.get(BundleStaged) is not None
        if bundle or ctx.results.get(NextBootTaken) is not None:
            source = "a prebuilt bundle" if bundle else "the next-boot stage"
            log.info("step_skipped", step=step.name, reason=f"staged from {source}")
            return None
        return step.run(ctx)

    return replace(step, run=run, detail=step.detail + note)
