"""What every distro declares (how it is recognised, its default driver version, its
title and image) and provides (a driver version, a cache key and a plan), and
the plan skeleton all of them share."""

from __future__ import annotations

import abc
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import structlog

from installer import cache, modules
from installer.cache import CacheKey
from installer.distros.daemonset import DaemonSetNeeds
from installer.osinfo import HostInfo
from installer.plan import Plan, Step
from installer.settings import DistroOptions, Settings
from installer.steps import activate, checks, next_boot, staging
from installer.values import is_driver_version
from installer.workstate import InUse

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)


class Distro(abc.ABC):
    # The distro's name: HostInfo.family, ``manifests render --flavor`` (and, unless
    # image_suffix says otherwise, the image's suffix).
    name: ClassVar[str]
    title: ClassVar[str]  # e.g. "Ubuntu", in manifests and messages
    # os-release ID (or one of ID_LIKE) values this distro handles.
    os_ids: ClassVar[tuple[str, ...]]
    default_version: ClassVar[str]  # what NVIDIA_DRIVER_VERSION defaults to in the manifests
    # Names the node resolves to a driver version (COS: default, latest, R535) and how
    # messages list them; None: explicit versions only.
    version_alias: ClassVar[re.Pattern[str] | None] = None
    version_alias_help: ClassVar[str] = ""
    # GKE's cloud.google.com/gke-os-distribution values (the *_containerd names are the
    # image-type spellings GKE has also used).
    gke_os_distributions: ClassVar[tuple[str, ...]]
    # Its DaemonSet's own mounts, env and network; its image is
    # nvidia-driver-installer-<image_suffix> (None: its own name).
    daemonset: ClassVar[DaemonSetNeeds] = DaemonSetNeeds()
    image_suffix: ClassVar[str | None] = None
    # Where this distro gets modules a signature-enforcing kernel accepts, and what to do
    # about it (None: it only builds unsigned modules).
    signed_modules: ClassVar[tuple[str, str] | None] = None
    # Its own options (Settings.distro_options; None: it has none), e.g. cos/options.py.
    options: ClassVar[type[DistroOptions] | None] = None
    # When a cached install is stale on this distro's nodes: the likely cause, and what
    # install then does (doctor's advice).
    stale_cache: ClassVar[tuple[str, str]] = ("kernel updated?",
                                              "rebuilds for the running kernel")

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
    def node_key(cls, info: HostInfo, driver_version: str) -> CacheKey:
        """What an install of ``driver_version`` on this node is keyed by (here: the
        kernel it was built for)."""
        return CacheKey(driver_version, kernel_release=info.kernel_release)

    @classmethod
    def image(cls) -> str:
        """The suffix of its image's name (``{flavor}`` in ``manifests render --image``)."""
        return cls.image_suffix or cls.name

    @classmethod
    def check_version_request(cls, value: str) -> str:
        """``value`` when this distro installs it (a version or one of its aliases), else
        ValueError saying what it accepts."""
        if is_driver_version(value) or (cls.version_alias and cls.version_alias.fullmatch(value)):
            return value
        if cls.version_alias:
            raise ValueError(f"driver version {value!r} for {cls.name} is neither a version "
                             f"(e.g. 550.127.05) nor an alias ({cls.version_alias_help})")
        raise ValueError(f"driver version {value!r} for {cls.name} must be an explicit version "
                         "(e.g. 550.127.05); it has no aliases")

    def check_settings(self, ctx: Context) -> None:
        """Refuse another distro's options that mean nothing on this OS (UsageError),
        before the lock."""
        for options in ctx.settings.distro_options:
            refused = None if isinstance(options, self.options or ()) else options.refused_on(
                self.title)
            if refused is not None:
                raise refused

    def unpinned_artifacts(self, settings: Settings) -> str | None:
        """What this distro downloads besides the .run that nothing pins (None: all pinned,
        or nothing else)."""
        return settings.options(self.options).unpinned() if self.options else None

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


def cached_plan(ctx: Context, version: str, check_gpus: Step, *, module_type: str | None,
                display: dict[str, object]) -> Plan:
    """A cache hit in any distro: check the GPUs, then load and verify what is installed
    (and drop a tree staged for the next boot: this version is the one wanted now)."""
    loading = () if ctx.settings.install_only else (checks.check_module_loading(version),)
    return Plan("cached", (check_gpus, *loading, next_boot.drop_next_boot(version),
                           *activate.load_cached(ctx, version)),
                driver_version=version, kernel_module_type=module_type, display=display)


def fresh_plan(ctx: Context, version: str, key: CacheKey, *, module_type: str, driver_url: str,
               driver_sha256: str | None = None, display: dict[str, object],
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
        staging.prepare_staging(),
        next_boot.take_next_boot(key),
        *((_unless_filled(prebuilt), _unless_filled(check_signing, note)) if prebuilt else ()),
        *(_unless_filled(s, note) for s in (*before_staging, *build)),
    )
    typed = {"driver_version": version, "kernel_module_type": module_type,
             "driver_url": driver_url, "driver_sha256": driver_sha256}
    # A load is needed now, or at the next boot for a staged version: a kernel refusing
    # every load (kernel.modules_disabled=1, usually the node image's) stops both first.
    loading = () if ctx.settings.install_only else (checks.check_module_loading(version),)
    if in_use is not None:
        return Plan("staged", (
            check_gpus, *loading, *early, *fill, *next_boot.stage_for_next_boot(key, in_use),
        ), **typed, display={**display, "running_driver_version": in_use.running_version})
    return Plan("fresh", (
        check_gpus, *loading, *early, checks.check_loaded_driver(version), *fill,
        *activate.activate_staged(ctx, version, key),
    ), **typed, display=display)


def _in_use_to_stage(ctx: Context, version: str) -> InUse | None:
    """The other driver to leave running: when --when-in-use stage asks to wait for it, or
    whenever the kernel can unload nothing before a reboot (no CONFIG_MODULE_UNLOAD:
    failing would change nothing a drain could fix)."""
    if ctx.settings.install_only:
        return None
    if ctx.settings.when_in_use != "stage" and ctx.kernel.can_unload():
        return None
    found = modules.in_use_by_other(ctx.kernel, version)
    if found is not None:
        log.info("driver_in_use", running=found.running_version, holders=found.holders,
                 wanted=version, when_in_use=ctx.settings.when_in_use)
    return found


def _unless_filled(step: Step, note: str = "") -> Step:
    """``step`` only while nothing has filled the staging dir yet (``note``: for --dry-run)."""

    def run(ctx: Context) -> None:
        if ctx.work.bundle is not None or ctx.work.from_next_boot:
            source = "a prebuilt bundle" if ctx.work.bundle is not None else "the next-boot stage"
            log.info("step_skipped", step=step.name, reason=f"staged from {source}")
            return
        step.run(ctx)

    return Step(step.name, run, step.detail + note, check=step.check)
