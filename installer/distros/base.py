"""What every distro declares (how it is recognised, its default driver version, its
title and manifest flavour) and provides (a driver version, a cache key and a plan), and
the plan skeleton all of them share."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar

import structlog

from installer import cache, modules, steps
from installer.cache import CacheKey
from installer.context import Context
from installer.osinfo import HostInfo
from installer.plan import Plan, Step
from installer.workstate import InUse

log = structlog.get_logger(__name__)


class Distro(abc.ABC):
    # The family name: HostInfo.family, the manifest flavour, the image's suffix.
    name: ClassVar[str]
    title: ClassVar[str]  # e.g. "Ubuntu", in manifests and messages
    # os-release ID (or one of ID_LIKE) values this distro handles.
    os_ids: ClassVar[tuple[str, ...]]
    default_version: ClassVar[str]  # what NVIDIA_DRIVER_VERSION defaults to in the manifests
    # GKE's cloud.google.com/gke-os-distribution values (the *_containerd names are the
    # image-type spellings GKE has also used).
    gke_os_distributions: ClassVar[tuple[str, ...]]
    # Where this distro gets modules a signature-enforcing kernel accepts, and what to do
    # about it (None: it only builds unsigned modules).
    signed_modules: ClassVar[tuple[str, str] | None] = None
    # The Settings field pinning this distro's own downloads besides the .run, and how
    # the unpinned-artifacts warning names it (None: it downloads nothing else).
    artifact_pin: ClassVar[tuple[str, str] | None] = None

    @classmethod
    def recognise(cls, fields: dict[str, str], lsb_release: str | None, kernel_release: str,
                  os_release_path: str) -> HostInfo | None:
        """The host facts when os-release ``fields`` name this distro, else None."""
        os_id = fields.get("ID", "").lower()
        id_like = fields.get("ID_LIKE", "").lower().split()
        if os_id not in cls.os_ids and not set(id_like) & set(cls.os_ids):
            return None
        return HostInfo(os_id, cls.name, fields.get("VERSION_ID", ""),
                        fields.get("PRETTY_NAME", os_id), kernel_release)

    @classmethod
    def support(cls, info: HostInfo) -> str:
        """How this flow serves the host, said honestly (``detect``, the install log)."""
        if info.os_id == cls.name:
            return "supported"
        if info.os_id in cls.os_ids:
            return f"supported: {info.os_id.capitalize()} via the {cls.title} flow"
        return (f"not tested: {info.os_id} follows the {cls.title} flow because its os-release "
                f"ID_LIKE names {'/'.join(cls.os_ids)}")

    @classmethod
    def create(cls) -> Distro:
        """The instance that plans installs (a subclass may live in a heavier module)."""
        return cls()

    def check_settings(self, ctx: Context) -> None:
        """Refuse options that mean nothing on this OS (UsageError), before the lock."""
        return

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
        record = cache.read(ctx.install.cache_file)
        if record is None:
            log.info("cache_miss", reason="no .cache record", path=str(ctx.install.cache_file))
            return False
        reason = record.mismatch(key) or cache.check_files(record, ctx.install.root)
        if reason:
            log.info("cache_miss", reason=reason)
            return False
        log.info("cache_hit", key=key.describe())
        return True


def cached_plan(ctx: Context, version: str, check_gpus: Step,
                summary: dict[str, object]) -> Plan:
    """A cache hit in any distro: check the GPUs, then load and verify what is installed
    (and drop a tree staged for the next boot: this version is the one wanted now)."""
    return Plan("cached", (check_gpus, steps.drop_next_boot(version),
                           *steps.load_cached(ctx, version)), summary)


def fresh_plan(ctx: Context, version: str, key: CacheKey, summary: dict[str, object], *,
               check_gpus: Step, check_signing: Step, before_staging: Sequence[Step] = (),
               build: Sequence[Step], prebuilt: Step | None = None) -> Plan:
    """A fresh install in any distro: every check before any download, then the distro's
    own steps that fill the staging dir, then load, verify, swap in and record.

    The staging dir is filled by the first that can: the tree staged for the next boot
    (``take_next_boot``: after the reboot, no download, no compile), then ``prebuilt`` (a
    fleet's bundle, ``--prebuilt-url``), then the distro's headers and build. The signing
    check is skipped only for a bundle (a signed bundle loads where our own unsigned build
    would be refused).

    With ``--when-in-use stage`` and another driver loaded and in use, the plan is
    ``staged``: the same fill and checks, then the tree is kept for the next boot and the
    running driver verified, untouched (nextboot.py)."""
    in_use = _in_use_to_stage(ctx, version)
    # Without a bundle the signing check goes first, before any download; with one, after
    # it (whether the bundle is signed decides).
    early = () if prebuilt else (check_signing,)
    note = " (only without a prebuilt bundle)" if prebuilt else ""
    fill = (
        steps.prepare_staging(),
        steps.take_next_boot(key),
        *((_unless_filled(prebuilt), _unless_filled(check_signing, note)) if prebuilt else ()),
        *(_unless_filled(s, note) for s in (*before_staging, *build)),
    )
    if in_use is not None:
        return Plan("staged", (
            check_gpus, *early, *fill, *steps.stage_for_next_boot(key, in_use),
        ), {**summary, "running_driver_version": in_use.running_version})
    return Plan("fresh", (
        check_gpus, *early, steps.check_loaded_driver(version), *fill,
        *steps.activate_staged(ctx, version, key),
    ), summary)


def _in_use_to_stage(ctx: Context, version: str) -> InUse | None:
    """The other driver to leave running, when --when-in-use stage asks to wait for it."""
    if ctx.settings.when_in_use != "stage" or ctx.settings.install_only:
        return None
    found = modules.in_use_by_other(ctx.kernel, version)
    if found is None:
        return None
    log.info("driver_in_use", running=found[0], holders=found[1], wanted=version,
             when_in_use="stage")
    return InUse(*found)


def _unless_filled(step: Step, note: str = "") -> Step:
    """``step`` only while nothing has filled the staging dir yet (``note``: for --dry-run)."""

    def run(ctx: Context) -> None:
        if ctx.work.bundle is not None or ctx.work.from_next_boot:
            source = "a prebuilt bundle" if ctx.work.bundle is not None else "the next-boot stage"
            log.info("step_skipped", step=step.name, reason=f"staged from {source}")
            return
        step.run(ctx)

    return Step(step.name, run, step.detail + note, check=step.check)
