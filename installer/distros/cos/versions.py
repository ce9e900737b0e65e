"""Which driver version a COS install means: explicit, named by --driver-url, or an
alias of the build (default, latest, R535) with a fallback for GPUs it cannot drive."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from installer.base import branches
from installer.base.errors import DownloadError
from installer.distros.cos.artifacts import (
    DEFAULT_ALIAS,
    LATEST_ALIAS,
    Artifacts,
    MissingArtifactError,
    Requested,
    Resolved,
    parse_requested,
)
from installer.driver.nvidia_urls import version_from_url
from installer.host import gpus
from installer.net.retry import RetryPolicy
from installer.records import cache

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)


def quick_policy() -> RetryPolicy:
    """When a cached install of this build exists, an unreachable artifacts server
    should not hold up the restart for the full download policy."""
    return RetryPolicy(attempts=2, wait_initial=1.0, wait_max=2.0, total_timeout=20.0,
                       connect_timeout=5.0, read_timeout=10.0)


def usable_cache(ctx: Context) -> cache.CacheRecord | None:
    """The .cache record of an intact install for this build, if any."""
    if ctx.settings.force:
        return None
    record = ctx.node.installed
    if (record is None or record.build_id != ctx.host_info.build_id
            or not record.driver_version
            or cache.check_files(record, ctx.install.root) is not None):
        return None
    return record

def resolve(ctx: Context, artifacts: Callable[[RetryPolicy | None], Artifacts]) -> Resolved:
    """The version to install: explicit, from --driver-url, or an alias of this build."""
    if ctx.settings.driver_url and not ctx.settings.driver_version:
        # The .run named explicitly says which version it is (as on Ubuntu).
        return Resolved(version_from_url(ctx.settings.driver_url), "(from --driver-url)")
    requested = parse_requested(ctx.settings.driver_version)
    if requested.version is not None:
        return Resolved(requested.version, requested.raw)
    record = usable_cache(ctx)
    arts = artifacts(quick_policy() if record else None)
    try:
        resolved = arts.resolve(requested)
    except MissingArtifactError:
        raise
    except DownloadError as exc:
        if record is None or record.driver_version is None:
            raise
        # An alias of a given build names one version; the cached install of
        # this build is what it resolved to when the server was reachable.
        log.warning("driver_version_alias_unreachable", alias=requested.alias,
                    error=exc.message, using_cached=record.driver_version)
        return Resolved(record.driver_version, requested.raw, requested.alias,
                        "(cached install of this build; artifacts unreachable)")
    if requested.alias in (DEFAULT_ALIAS, LATEST_ALIAS):
        resolved = _gpu_fallback(ctx, arts, resolved)
    return resolved

def _gpu_fallback(ctx: Context, arts: Artifacts, resolved: Resolved) -> Resolved:
    """default/latest name a branch these GPUs cannot use: the newest branch alias
    of this build that they can (an explicit version or branch is never changed)."""
    found = list(ctx.pci_gpus)
    for alias in fallback_alias(found, resolved.version):
        try:
            alt = arts.resolve(Requested(alias, alias=alias))
        except MissingArtifactError:
            continue
        if gpus.branch_problems(found, alt.version):
            continue
        why = (f"{resolved.alias} names {resolved.version}, which "
               f"{', '.join(sorted({g.name for g in found if g.model}))} cannot use; "
               f"using {alias} = {alt.version}")
        log.warning("driver_version_fallback", driver_version=alt.version, reason=why)
        return Resolved(alt.version, resolved.requested, alias, alt.source_url, why)
    return resolved


def fallback_alias(gpus_found: list[gpus.PciGpu], version: str) -> list[str]:
    """Branch aliases (newest first) to try when ``version`` cannot drive these GPUs
    (K80 on a build whose default is R535: R470), as Google's installer falls back."""
    if not gpus.branch_problems(gpus_found, version):
        return []
    fallbacks = [branches.branch_of(v) for v in gpus.FALLBACK_VERSIONS]
    return [f"R{b}" for b in fallbacks
            if b is not None and not gpus.branch_problems(gpus_found, f"{b}.0")]
