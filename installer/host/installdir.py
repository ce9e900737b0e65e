"""The install dir layout (docs/contract.md §4) and how a new install replaces the old one.

A new install is built in ``.staging/`` and only promoted over ``bin/``,
``lib64/``, ``drivers/`` and ``firmware/`` once it is complete and verified.
The ``.cache`` record is removed just before the swap and written again only
after the final verification, so a run killed at any point leaves nothing a
later run takes for a good install.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import structlog

from installer.base import podcontract, signals
from installer.base.dataclass import dataclass
from installer.base.errors import UnsupportedHostError, UsageError
from installer.base.fsutil import fsync_dir, remove_tree
from installer.host.hostroot import HostRoot

log = structlog.get_logger(__name__)

LAYOUT_DIRS = ("bin", "lib64", "drivers", "firmware")
BUILD_LOG = "kernel-build.log"  # make's output of the last build (nvidia_run.KBUILD_LOG)


def check_layout_path(rel: object, what: str = "path") -> str:
    """``rel`` if it is a clean relative path inside one of the layout dirs (never the
    dir itself), else ValueError: records and bundles name files this way, and both are
    hostile input."""
    if not isinstance(rel, str) or not rel or len(rel) > 4095 or not rel.isprintable():
        raise ValueError(f"{what} {rel!r} is not a short printable path")
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{what} {rel!r} is not a clean relative path")
    if parts[0] not in LAYOUT_DIRS or len(parts) < 2:
        raise ValueError(f"{what} {rel!r} is not inside {', '.join(LAYOUT_DIRS)}")
    return rel


@dataclass(frozen=True)
class Tree:
    """A directory holding the layout dirs: the live install or a staging area."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def lib64(self) -> Path:
        return self.root / "lib64"

    @property
    def drivers(self) -> Path:
        return self.root / "drivers"

    @property
    def firmware(self) -> Path:
        return self.root / "firmware"


@dataclass(frozen=True)
class InstallDir(Tree):
    host_path: PurePosixPath  # where the host sees ``root`` (the pod mounts it elsewhere)

    # The last build's logs, promoted with it (nvidia-installer's, make's).
    LOGS = ("nvidia-installer.log", BUILD_LOG)

    @property
    def cache_file(self) -> Path:
        return self.root / ".cache"

    @property
    def status_file(self) -> Path:
        return self.root / "status.json"

    @property
    def staging_dir(self) -> Path:
        return self.root / ".staging"

    @property
    def previous_dir(self) -> Path:
        return self.root / ".previous"

    @property
    def next_boot_dir(self) -> Path:
        """A checked install kept for the next boot while another driver is in use
        (records/staged_driver.py)."""
        return self.root / ".next-boot"

    @property
    def installer_log(self) -> Path:
        return self.root / "nvidia-installer.log"

    def lib64_host(self) -> PurePosixPath:
        return self.host_path / "lib64"

    def host_view(self, path: Path) -> PurePosixPath:
        """The host's name for ``path`` under this install dir (staging included)."""
        return self.host_path / Path(path).relative_to(self.root).as_posix()

    def check_writable(self) -> None:
        """Exit 3 naming this dir and its mount when it (or, not made yet, the dir it will be
        made in) is on a read-only mount: checked before the lock, so nothing has changed
        yet. (Missing privileges are the lock's to name: exit 2.)"""
        existing = next(p for p in (self.root, *self.root.parents) if p.exists())
        try:
            if os.access(existing, os.W_OK) or not os.statvfs(existing).f_flag & os.ST_RDONLY:
                return
        except OSError:
            return
        raise UnsupportedHostError(
            f"the install dir {self.root} (host {self.host_path}) is not writable: a read-only "
            "file system",
            hint=f"mount the host's {self.host_path} read-write at {self.root} (the DaemonSet's "
            "nvidia-install-dir-host volume must not be readOnly)",
            path=str(self.root))

    def check_host_path(self, seen_from_host: Path) -> None:
        """Exit 2 unless ``seen_from_host`` (``<host-root>/<install-dir-host>``, resolved
        on the host) is this very dir: the host's ld.so.conf entry and driver-ready name
        ``host_path``, so the files must land there (``--install-dir-host /`` would point
        the host's loader at its own /lib64 and /bin). Same device and inode, not the
        same name: the pod mounts the host dir somewhere else."""
        def identity(path: Path) -> tuple[int, int] | None:
            try:
                st = os.stat(path)
            except OSError:
                return None
            return st.st_dev, st.st_ino

        if seen_from_host == self.root:
            return
        ours = identity(self.root)
        if ours is not None and ours == identity(seen_from_host):
            return
        raise UsageError(
            f"--install-dir-host {self.host_path} is not the directory mounted at "
            f"--install-dir {self.root}: the host's loader and driver-ready would point at "
            f"{self.host_path}, the files would land elsewhere",
            hint=f"set --install-dir-host (NVIDIA_INSTALL_DIR_HOST) to the host dir mounted at "
            f"{self.root} (the DaemonSet's nvidia-install-dir-host volume), or --install-dir "
            "(NVIDIA_INSTALL_DIR_CONTAINER) to where it is mounted",
            path=str(self.host_path))

    def clear_leftovers(self) -> None:
        """Remove what a killed run may have left: never part of a good install."""
        for leftover in (self.staging_dir, self.previous_dir):
            if leftover.exists():
                log.info("leftover_removed", path=str(leftover))
                remove_tree(leftover)

    def discard_staging(self) -> None:
        """After a failed run: the half-built install goes, the live one stays as it was."""
        if self.staging_dir.exists():
            try:
                remove_tree(self.staging_dir)
            except OSError as exc:  # the next run's clear_leftovers tries again
                log.warning("staging_not_removed", path=str(self.staging_dir), error=str(exc))

    def new_staging(self) -> Tree:
        self.root.mkdir(parents=True, exist_ok=True)
        remove_tree(self.staging_dir)
        staging = Tree(self.staging_dir)
        for name in LAYOUT_DIRS:
            (staging.root / name).mkdir(parents=True)
        return staging

    def promote(self, staging: Tree) -> None:
        """Swap the staged layout dirs in (renames on one filesystem).

        SIGTERM/SIGINT wait until the swap is done: the renames take
        milliseconds, and a half-swapped install helps no one.
        """
        with signals.deferred():
            self._promote(staging)

    def _promote(self, staging: Tree) -> None:
        # The old layout, its .cache and its log wait in .previous until the new install is
        # recorded (commit) or a failure puts them back (restore_previous). The live dir has
        # no .cache meanwhile, so a run killed here leaves nothing taken for a good install.
        # A rename that fails half way (EBUSY: a mount point; EIO) has what was done undone
        # here, newest first: the live install is then as it was, and so is staging.
        undo: list[Callable[[], None]] = []

        def move(src: Path, dst: Path) -> None:
            if src.exists() or src.is_symlink():
                os.replace(src, dst)
                undo.append(lambda: os.replace(dst, src))

        try:
            if not self.previous_dir.exists():
                self.previous_dir.mkdir()
                undo.append(self.previous_dir.rmdir)
            move(self.cache_file, self.previous_dir / self.cache_file.name)
            fsync_dir(self.root)
            for name in LAYOUT_DIRS:
                live, new = self.root / name, staging.root / name
                move(live, self.previous_dir / name)
                if new.exists():
                    move(new, live)
                else:
                    live.mkdir()
                    undo.append(live.rmdir)
            # nvidia-installer's log and make's (kernel-build.log: nvidia_run.KBUILD_LOG).
            for log_name in self.LOGS:
                if (staging.root / log_name).exists():
                    move(self.root / log_name, self.previous_dir / log_name)
                    move(staging.root / log_name, self.root / log_name)
        except OSError:
            for step in reversed(undo):
                step()
            fsync_dir(self.root)
            raise
        fsync_dir(self.root)
        remove_tree(staging.root)

    def commit(self) -> None:
        """The promoted install is recorded: the old one goes for good."""
        remove_tree(self.previous_dir)

    def restore_previous(self) -> bool:
        """Undo ``promote`` after a later failure: the old layout, .cache and log come back
        byte-identical and the new layout goes. False when nothing was waiting."""
        if not self.previous_dir.is_dir():
            return False
        with signals.deferred():
            self.cache_file.unlink(missing_ok=True)
            fsync_dir(self.root)
            for name in LAYOUT_DIRS:
                remove_tree(self.root / name)
                _move(self.previous_dir / name, self.root / name)
            for name in (*self.LOGS, self.cache_file.name):
                # A log only moved when the new install brought one; the record goes last.
                _move(self.previous_dir / name, self.root / name)
            fsync_dir(self.root)
            remove_tree(self.previous_dir)
        log.info("previous_install_restored", install_dir=str(self.root))
        return True

    def remove_install(self) -> None:
        """Uninstall: the layout dirs and the record go, logs and status stay."""
        remove_tree(self.cache_file)  # whatever it is: a directory there must not stop it
        for name in LAYOUT_DIRS:
            remove_tree(self.root / name)
        remove_tree(self.next_boot_dir)  # nothing is to be installed at the next boot either
        self.clear_leftovers()


def locate(host_root: Path, install_dir: Path | None, install_dir_host: PurePosixPath) -> InstallDir:
    """The install dir as this process sees it: ``install_dir`` (--install-dir), else the
    pod contract's mount if there is one, else the host's dir through the host root,
    resolved on the host (kubectl debug: a symlinked /home must not send us into this
    container's own /home). UsageError when it is not a directory."""
    found = install_dir
    if found is None and podcontract.INSTALL_DIR_CONTAINER.is_dir():
        found = podcontract.INSTALL_DIR_CONTAINER
    elif found is None:
        found = HostRoot(host_root).resolve(install_dir_host)
    if found.exists() and not found.is_dir():
        named = "--install-dir" if install_dir else "<host-root>/<install-dir-host>"
        raise UsageError(f"{named} {found} is not a directory",
                         hint="name the driver's install dir (NVIDIA_INSTALL_DIR_CONTAINER / "
                         "NVIDIA_INSTALL_DIR_HOST), not a file in it")
    return InstallDir(found, install_dir_host)


def _move(src: Path, dst: Path) -> None:
    """rename(2) when ``src`` exists (a dangling symlink is moved as it is)."""
    if src.exists() or src.is_symlink():
        os.replace(src, dst)
