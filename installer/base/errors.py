"""Failure classes and their exit codes (docs/contract.md §3).

Domain code raises an ``InstallerError`` subclass; only ``cli`` turns it into
an exit code. Each error carries a one-line message, an optional hint saying
what to do next, and the URL / path / kernel release it is about.
"""

from __future__ import annotations

import enum
import errno
import os
import re
from typing import Any

# A value the user gave, echoed back in a message, is cut to this many characters: a
# 10 kB --driver-version must not fill the terminal (or the log line) three times over.
ECHO_LIMIT = 80
MESSAGE_LIMIT = 2000
# A repr'd value: a quote not inside a word (so "can't … NVIDIA's" is left alone).
_LONG = f"{{{ECHO_LIMIT + 1},}}"
_QUOTED = re.compile(rf"""(?<!\w)('[^'\n]{_LONG}'|"[^"\n]{_LONG}")(?!\w)""")


def clip(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis when it was longer."""
    return text if len(text) <= limit else text[:limit] + "…"


def clip_message(message: str) -> str:
    """Quoted values (``{value!r}``) over ECHO_LIMIT are cut; so is the whole message."""
    message = _QUOTED.sub(lambda m: m[0][0] + clip(m[0][1:-1]) + m[0][0], message)
    return clip(message, MESSAGE_LIMIT)


class ExitCode(enum.IntEnum):
    OK = 0
    INTERNAL = 1
    USAGE = 2
    UNSUPPORTED_HOST = 3
    LOCKED = 4
    DOWNLOAD = 5
    INTEGRITY = 6
    BUILD = 7
    MODULE_LOAD = 8
    VERIFY = 9
    SECURE_BOOT = 10
    DISK_SPACE = 11
    NOT_INSTALLED = 12  # `status`: the installer has never run on this node
    INTERRUPTED = 130  # SIGINT (Ctrl-C): 128 + 2
    TERMINATED = 143  # SIGTERM (the kubelet deleting the pod): 128 + 15


# What each exit code means, for `install --help` and the README (docs/contract.md §3, plus 12).
EXIT_CODE_MEANINGS = {
    ExitCode.OK: "installed and verified (or --dry-run done)",
    ExitCode.INTERNAL: "unexpected internal error (a bug: traceback shown)",
    ExitCode.USAGE: "usage error (bad flag or combination; not root / not privileged)",
    ExitCode.UNSUPPORTED_HOST: "unsupported or unreadable host (no os-release, unknown OS, "
                               "read-only root)",
    ExitCode.LOCKED: "another installer holds the host lock",
    ExitCode.DOWNLOAD: "download failed",
    ExitCode.INTEGRITY: "integrity failure (checksum mismatch, corrupt archive or status file)",
    ExitCode.BUILD: "build failed (no kernel headers, NVIDIA installer failed)",
    ExitCode.MODULE_LOAD: "module load failed, or another driver is loaded and in use",
    ExitCode.VERIFY: "verification failed (nvidia-smi, device nodes; doctor: a check failed)",
    ExitCode.SECURE_BOOT: "blocked by Secure Boot / module signature enforcement",
    ExitCode.DISK_SPACE: "not enough disk space",
    ExitCode.NOT_INSTALLED: "status: the installer has not run on this node",
    ExitCode.INTERRUPTED: "interrupted (SIGINT, Ctrl-C)",
    ExitCode.TERMINATED: "terminated (SIGTERM: the kubelet deleting the pod)",
}


class InstallerError(Exception):
    """An expected failure: logged as one line, no traceback."""

    exit_code: ExitCode = ExitCode.INTERNAL
    error_class: str = "internal"

    def __init__(self, message: str, *, hint: str | None = None, **context: Any) -> None:
        message = clip_message(message)
        super().__init__(message)
        self.message = message
        self.hint = hint
        # url=, path=, kernel_release=, ...: what the failure is about.
        self.context = {k: v for k, v in context.items() if v is not None}


class UsageError(InstallerError):
    exit_code = ExitCode.USAGE
    error_class = "usage"


class UnsupportedHostError(InstallerError):
    exit_code = ExitCode.UNSUPPORTED_HOST
    error_class = "unsupported_host"


class LockHeldError(InstallerError):
    exit_code = ExitCode.LOCKED
    error_class = "locked"


class DownloadError(InstallerError):
    exit_code = ExitCode.DOWNLOAD
    error_class = "download"


class IntegrityError(InstallerError):
    exit_code = ExitCode.INTEGRITY
    error_class = "integrity"


class BuildError(InstallerError):
    exit_code = ExitCode.BUILD
    error_class = "build"


class ModuleLoadError(InstallerError):
    exit_code = ExitCode.MODULE_LOAD
    error_class = "module_load"


class VerifyError(InstallerError):
    exit_code = ExitCode.VERIFY
    error_class = "verify"


class SecureBootError(InstallerError):
    exit_code = ExitCode.SECURE_BOOT
    error_class = "secure_boot"


class DiskSpaceError(InstallerError):
    exit_code = ExitCode.DISK_SPACE
    error_class = "disk_space"


class NotInstalledError(InstallerError):
    exit_code = ExitCode.NOT_INSTALLED
    error_class = "not_installed"


PRIVILEGES_HINT = ("run as root on the node, or in a privileged container (the DaemonSet's "
                   "securityContext.privileged: true)")


def from_os_error(exc: OSError) -> InstallerError | None:
    """The environment failures any command can meet, as a one-line error: no privileges
    (usage: run it as documented, exit 2), a read-only host or a path something else holds
    (exit 3), a full disk or quota (exit 11); else None (a bug)."""
    path = os.fsdecode(exc.filename) if exc.filename else None
    where = f" on {path}" if path else ""
    if exc.errno in (errno.EACCES, errno.EPERM):
        why = ("the installer needs root privileges" if os.geteuid() != 0 else
               "root here lacks privileges (an unprivileged container, or a security module)")
        return UsageError(f"permission denied{where}: {why}", hint=PRIVILEGES_HINT, path=path)
    if exc.errno == errno.EROFS:
        return UnsupportedHostError(
            f"read-only file system{where}: the installer writes to the host root",
            hint="mount the host's / read-write (the pod's /root volume must not be readOnly)",
            path=path)
    if exc.errno == errno.EBUSY:
        return UnsupportedHostError(
            f"device or resource busy{where}: something on the node holds it (a mount on it?)",
            hint="find what holds it (grep it in /proc/mounts on the node), unmount or stop "
            "it, then re-run", path=path)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskSpaceError(
            f"{os.strerror(exc.errno).lower()}{where}",
            hint="free space on the node's filesystem holding the install dir (df -h "
            "/home/kubernetes/bin/nvidia on the node), then re-run", path=path)
    return None
