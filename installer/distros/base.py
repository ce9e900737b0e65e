"""What every distro provides: a driver version, a cache key and a plan."""

from __future__ import annotations

import abc

import structlog

from installer import cache
from installer.cache import CacheKey
from installer.context import Context
from installer.plan import Plan

log = structlog.get_logger(__name__)


class Distro(abc.ABC):
    name: str

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
