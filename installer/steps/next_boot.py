"""Steps around a version kept for the next boot (the wanted driver while another is in use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from installer.plan import Step
from installer.records import staged_driver as nextboot
from installer.records.cache import CacheKey
from installer.records.results import InUse, KeptForNextBoot, NextBootTaken, Staged
from installer.steps.activate import container_ld_cache, dev_char_links, verify_install
from installer.steps.staging import check_staged_modules

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)


def take_next_boot(key: CacheKey) -> Step:
    """After the reboot: the version staged for it fills the staging dir (no download, no
    compile) when it is for this node's key; one for anything else is discarded."""

    def run(ctx: Context) -> NextBootTaken | None:
        taken = nextboot.take(ctx.install, ctx.results.staging(), key)
        return NextBootTaken() if taken else None

    return Step("take_next_boot", run, f"<install-dir>/.next-boot if it holds {key.describe()}",
                needs=(Staged,), gives=(NextBootTaken,))


def stage_next_boot(key: CacheKey, in_use: InUse) -> Step:
    """The checked staging tree kept for the next boot; the running driver untouched."""

    def run(ctx: Context) -> KeptForNextBoot:
        nextboot.stage(ctx.install, ctx.results.staging(), key)
        log.warning("driver_staged_for_next_boot", running=in_use.running_version,
                    staged=key.driver_version, holders=in_use.holders,
                    message=f"NVIDIA driver {in_use.running_version} is in use "
                    f"({in_use.holders}): it keeps running; {key.describe()} is staged and "
                    "installs at the next boot (drain and reboot the node to switch now)")
        return KeptForNextBoot(in_use)

    return Step("stage_next_boot", run, f"keep {key.describe()} in <install-dir>/.next-boot; "
                f"driver {in_use.running_version} stays loaded (in use: {in_use.holders})",
                needs=(Staged,), gives=(KeptForNextBoot,))


def drop_next_boot(version: str) -> Step:
    """A cache hit: the installed version is the one wanted, so nothing waits for a boot."""

    def run(ctx: Context) -> None:
        nextboot.discard(ctx.install, f"driver {version} is installed and is the one wanted")

    return Step("drop_next_boot", run, "remove <install-dir>/.next-boot if a run left one")


def stage_for_next_boot(key: CacheKey, in_use: InUse) -> tuple[Step, ...]:
    """--when-in-use stage: the checked build kept for the next boot, the running driver
    verified as it is (its readiness says what is pending)."""
    return (
        check_staged_modules(),
        stage_next_boot(key, in_use),
        container_ld_cache(),  # this container's: nvidia-smi of the running driver resolves
        verify_install(in_use.running_version),
        dev_char_links(),
    )
