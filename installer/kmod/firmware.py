"""GSP firmware where the host kernel's firmware loader finds it.

``nvidia.ko`` asks for ``nvidia/<V>/gsp_*.bin`` (``request_firmware``) when a
GPU initialises: always on Hopper, by default from Turing, always with the open
modules; without it ``RmInitAdapter`` fails and nvidia-smi finds no device. The
loader reads files in the init mount namespace, so paths are the host's, and
it looks only in ``firmware_class.path`` and then ``/lib/firmware/updates/<r>``,
``/lib/firmware/updates``, ``/lib/firmware/<r>``, ``/lib/firmware``
(linux ``drivers/base/firmware_loader/main.c``: ``fw_path``, ``fw_path_para``).

We point ``firmware_class.path`` at ``<install-dir-host>/firmware`` (COS's root
is read-only, so that is the only way there, as NVIDIA's driver container
does) when it is unset or already ours. A path someone else set is left alone:
the files go to the host's ``/lib/firmware/updates`` instead, or we stop.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import structlog

from installer.base.dataclass import dataclass
from installer.base.errors import ModuleLoadError
from installer.host.hostroot import HostRoot
from installer.host.installdir import InstallDir, Tree
from installer.kmod.kernel import KernelState

log = structlog.get_logger(__name__)

PATH_PARAM = "module/firmware_class/parameters/path"  # under /sys
PATH_MAX = 255  # fw_path_para is a char[256] module_param_string
HOST_UPDATES_DIR = "/lib/firmware/updates"


@dataclass(frozen=True)
class Placement:
    how: str  # "firmware_class.path", "copied" or "none"
    where: str  # the host dir the loader searches


def names(tree: Tree) -> list[str]:
    """Firmware names as the module requests them: ``nvidia/<V>/gsp_ga10x.bin``."""
    if not tree.firmware.is_dir():
        return []
    return sorted(p.relative_to(tree.firmware).as_posix()
                  for p in tree.firmware.rglob("*") if p.is_file())


def read_search_path(kernel: KernelState) -> str | None:
    """``firmware_class.path``: "" when unset, None when this kernel has no such parameter."""
    try:
        return (kernel.sys_dir / PATH_PARAM).read_text().strip()
    except OSError:
        return None


def set_search_path(kernel: KernelState, value: str) -> None:
    """Write ``firmware_class.path`` (OSError when it cannot be set here)."""
    (kernel.sys_dir / PATH_PARAM).write_text(value)


def ours(install: InstallDir) -> set[str]:
    """The live and the staged firmware dirs, as the host names them."""
    return {str(install.host_view(tree.firmware)) for tree in (install, Tree(install.staging_dir))}


def make_findable(kernel: KernelState, host: HostRoot, install: InstallDir, tree: Tree) -> Placement:
    """Make ``tree``'s firmware (the staged or the live install) visible to the loader."""
    wanted = names(tree)
    if not wanted:
        return Placement("none", "")
    target = str(install.host_view(tree.firmware))
    current = read_search_path(kernel)
    if current is not None and (current == "" or current in ours(install)) \
            and len(target) <= PATH_MAX:
        try:
            set_search_path(kernel, target)
        except OSError as exc:
            log.warning("firmware_path_not_set", path=target, error=str(exc))
        else:
            if read_search_path(kernel) == target:
                log.info("firmware_path_set", path=target, files=wanted)
                return Placement("firmware_class.path", target)
    why = (f"firmware_class.path is {current!r}, set by someone else" if current
           else "firmware_class.path cannot be set here")
    return _copy_to_host(host, tree, wanted, why)


def _copy_to_host(host: HostRoot, tree: Tree, wanted: list[str], why: str) -> Placement:
    try:
        for name in wanted:
            # Resolved inside the host root: a symlinked updates dir cannot send it elsewhere.
            host.write_atomic(PurePosixPath(HOST_UPDATES_DIR) / name,
                              (tree.firmware / name).read_bytes(), 0o644)
    except OSError as exc:
        raise ModuleLoadError(
            f"the GPU firmware cannot be made visible to the kernel: {why}, and the host's "
            f"{HOST_UPDATES_DIR} is not writable ({exc.strerror or exc})",
            hint="unset firmware_class.path on this node (or set it to "
            "<install-dir-host>/firmware); without GSP firmware the GPU does not initialise",
            path=HOST_UPDATES_DIR,
        ) from exc
    log.info("firmware_copied", why=why, where=HOST_UPDATES_DIR, files=wanted)
    return Placement("copied", HOST_UPDATES_DIR)


def our_copies(host: HostRoot, install: InstallDir) -> list[PurePosixPath]:
    """The host paths of the live install's firmware copies that are ours: a regular file
    byte-identical to the install's (what ``remove_copies`` removes)."""
    ours = []
    for name in names(install):
        host_path = PurePosixPath(HOST_UPDATES_DIR) / name
        copy = host.resolve(host_path.parent) / host_path.name  # the file itself: no link
        try:
            if not copy.is_symlink() and copy.is_file() and \
                    copy.read_bytes() == (install.firmware / name).read_bytes():
                ours.append(host_path)
        except OSError as exc:
            log.warning("firmware_copy_not_removed", path=str(host_path), error=str(exc))
    return ours


def remove_copies(host: HostRoot, install: InstallDir) -> list[str]:
    """``uninstall``: remove the copies ``_copy_to_host`` made of the live install's firmware
    (host paths removed). Only ours: a regular file byte-identical to the install's; a
    replaced or foreign file stays. Dirs left empty (``nvidia/<V>``) go too."""
    removed = []
    for host_path in our_copies(host, install):
        try:
            host.unlink(host_path)
            removed.append(str(host_path))
        except OSError as exc:
            log.warning("firmware_copy_not_removed", path=str(host_path), error=str(exc))
    for version_dir in {PurePosixPath(r).parent for r in removed}:
        for emptied in (version_dir, version_dir.parent):  # nvidia/<V>, then nvidia/
            try:
                host.resolve(emptied).rmdir()
            except OSError:
                break  # not empty (someone else's files), or gone: leave it
    return removed


def findable(kernel: KernelState, host: HostRoot, install: InstallDir) -> tuple[bool, str]:
    """For doctor: can the loader find every firmware file of the live install?"""
    wanted = names(install)
    if not wanted:
        return True, "no firmware in the install (R470 and older have none)"
    current = read_search_path(kernel) or ""
    dirs = [current] if current else []
    dirs.append(HOST_UPDATES_DIR)
    release = kernel.release()
    dirs += [f"{HOST_UPDATES_DIR}/{release}", f"/lib/firmware/{release}", "/lib/firmware"]
    missing = [n for n in wanted
               if not any(host.resolve(PurePosixPath(d) / n).is_file() for d in dirs)]
    if missing:
        return False, (f"the kernel cannot find {', '.join(missing)} (firmware_class.path "
                       f"{current or 'unset'})")
    return True, f"found by the kernel (firmware_class.path {current or 'unset'})"
