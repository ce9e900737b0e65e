"""A driver staged for the next boot, while another version is loaded and in use.

Replacing a driver that GPU workloads hold would take their GPUs away, and refusing
(exit 8) makes the DaemonSet's init container crash-loop until someone drains the node
(the field's most common complaint: GPU operator #2166, container-engine-accelerators
#107, ...). With ``--when-in-use stage`` the new version is built (or fetched) and checked
exactly as a fresh install would be -- checksums, every module's vermagic against the
running kernel, nothing loaded -- and then kept aside in ``<install-dir>/.next-boot``
with a ``.cache`` record of its own, while the running driver stays as it is.

After the reboot nothing is loaded, so the next run installs it: ``take`` moves the
staged tree into the staging area (no download, no compile) when its record matches
this node's key and its files their hashes; one staged for another kernel or driver is
discarded, with a message. The record and the hashes are ``cache``'s own format.
"""

from __future__ import annotations

import os

import structlog

from installer import __version__
from installer.base.fsutil import fsync_dir, remove_tree
from installer.host.installdir import LAYOUT_DIRS, InstallDir, Tree
from installer.records import cache
from installer.records.cache import CacheKey, CacheRecord

log = structlog.get_logger(__name__)


def record(install: InstallDir) -> CacheRecord | None:
    """What is staged for the next boot (None: nothing, or an unusable record)."""
    return cache.read(install.next_boot_dir / install.cache_file.name)


def stage(install: InstallDir, staging: Tree, key: CacheKey) -> None:
    """Keep the checked staging tree for the next boot, replacing whatever was there."""
    cache.write(staging.root / install.cache_file.name, key, staging.root, __version__)
    discard(install, None)
    os.replace(staging.root, install.next_boot_dir)
    fsync_dir(install.root)
    log.info("next_boot_staged", path=str(install.next_boot_dir), key=key.describe())


def take(install: InstallDir, staging: Tree, key: CacheKey) -> bool:
    """Fill ``staging`` from the tree staged for ``key``; False (and the staged tree
    discarded, saying why) when there is none or it is for something else."""
    if not install.next_boot_dir.exists():
        return False
    staged = record(install)
    why = ("its .cache record is missing or unusable" if staged is None
           else staged.mismatch(key) or cache.check_files(staged, install.next_boot_dir))
    if why:
        discard(install, f"staged for the next boot, but {why}")
        return False
    for name in LAYOUT_DIRS:
        if (install.next_boot_dir / name).is_dir():
            os.replace(install.next_boot_dir / name, staging.root / name)  # onto the empty dir
    for log_name in install.LOGS:
        if (install.next_boot_dir / log_name).exists():
            os.replace(install.next_boot_dir / log_name, staging.root / log_name)
    remove_tree(install.next_boot_dir)
    log.info("next_boot_taken", key=key.describe(),
             message=f"installing the {key.describe()} staged before the reboot: no download, "
             "no compile")
    return True


def discard(install: InstallDir, why: str | None) -> None:
    """Remove the tree staged for the next boot (``why``: said in the log)."""
    if not install.next_boot_dir.exists():
        return
    if why:
        log.warning("next_boot_discarded", path=str(install.next_boot_dir), reason=why)
    remove_tree(install.next_boot_dir)
