"""Readiness for other components (the metrics textfile is ``metrics``).

The NVIDIA GPU operator convention: ``/run/nvidia/validations/driver-ready``
on the host holds ``KEY=VALUE`` lines and exists only while a verified driver
is loaded. Every install removes it first and writes it again, atomically, only
after verification, so a consumer (device plugin, toolkit, a workload's init
container) waiting for the file never starts against a half-installed or
replaced driver. A failed run that leaves the node as it was puts the file it
found back (``rollback.undo``, docs/contract.md §4 "readiness as before"). ``/run`` is a
tmpfs: a reboot removes it with the driver.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

import structlog

from installer.base.dataclass import dataclass
from installer.host.hostroot import HostRoot
from installer.kmod.moduleargs import ModuleArg, parse_listed

log = structlog.get_logger(__name__)

READY_HOST_PATH = PurePosixPath("/run/nvidia/validations/driver-ready")


def clear(host: HostRoot) -> bool:
    """Remove the readiness file; True if there was one."""
    try:
        if not host.unlink(READY_HOST_PATH):
            return False
    except (IsADirectoryError, NotADirectoryError):
        return False  # not a file we wrote: the write after verification says so
    log.info("readiness_cleared", path=str(READY_HOST_PATH))
    return True


def format_fields(fields: Mapping[str, object]) -> str:
    lines = []
    for key, value in fields.items():
        text = "" if value is None else str(value)
        if "\n" in text:
            raise ValueError(f"readiness value for {key} spans lines")
        lines.append(f"{key}={text}")
    return "\n".join(lines) + "\n"


def parse(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.lstrip().startswith("#"):
            out[key.strip()] = value.strip()
    return out


def write(host: HostRoot, fields: Mapping[str, object]) -> Path:
    """Write the readiness file atomically (temp file + rename in the same dir)."""
    path = host.write_atomic(READY_HOST_PATH, format_fields(fields))
    log.info("readiness_written", path=str(READY_HOST_PATH))
    return path


# The health sidecar's own lines (services/health.py): the node's action (ok, reset, reboot,
# check) and why, one visible line. The install writes neither; the sidecar replaces only
# these, and only in a file the install wrote.
HEALTH_KEY = "GPU_HEALTH"
HEALTH_REASON_KEY = "GPU_HEALTH_REASON"
REASON_MAX_CHARS = 400


def visible(text: str, limit: int = REASON_MAX_CHARS) -> str:
    """One line of at most ``limit`` characters: backslash, control and non-ASCII characters
    as Python escapes (``\\n``, ``\\x1b``), cut with ``...`` past the limit."""
    escaped = text.encode("unicode_escape").decode("ascii")
    return escaped if len(escaped) <= limit else escaped[:limit - 3] + "..."


def with_own_lines(text: str, own: Mapping[str, str]) -> str:
    """``text`` with its ``own`` keys' lines replaced: every other line kept as it was, in
    its place; the new lines where the first old one was, else at the end."""
    new = [f"{key}={visible(value)}" for key, value in own.items()]
    kept: list[str] = []
    at = None
    for line in text.splitlines(keepends=True):
        if line.partition("=")[0].strip() in own:
            at = len(kept) if at is None else at
            continue
        kept.append(line)
    if kept and not kept[-1].endswith("\n"):
        kept[-1] += "\n"
    at = len(kept) if at is None else at
    return "".join(kept[:at] + [line + "\n" for line in new] + kept[at:])


def set_health(host: HostRoot, action: str, reason: str) -> bool:
    """Put the health sidecar's verdict in the readiness file the install wrote; True if
    the file changed. No file, no write: its absence means not ready, and the sidecar must
    never make a node look ready (``HostRoot.rewrite_existing``)."""
    own = {HEALTH_KEY: action, HEALTH_REASON_KEY: reason}
    written = host.rewrite_existing(READY_HOST_PATH, lambda text: with_own_lines(text, own))
    if written:
        log.info("readiness_health_written", path=str(READY_HOST_PATH), gpu_health=action)
    return written


def read_text(host: HostRoot) -> str | None:
    return host.read_text(READY_HOST_PATH)


def read(host: HostRoot) -> dict[str, str] | None:
    text = read_text(host)
    return None if text is None else parse(text)


def restore(host: HostRoot, text: str) -> None:
    """Put back, byte for byte, the file a run found before it cleared it."""
    host.write_atomic(READY_HOST_PATH, text)
    log.info("readiness_restored", path=str(READY_HOST_PATH),
             driver_version=parse(text).get("NVIDIA_DRIVER_VERSION"))


@dataclass(frozen=True)
class ReadyDriver:
    """What driver-ready says of the driver that runs now (install's verified plan)."""

    driver_version: str | None
    plan: str | None  # the plan's kind
    module_type: str | None
    gpu_count: int
    persistence_mode: str  # "off", "on" or "failed"
    pending_driver_version: str | None = None  # staged for the next boot
    module_args: tuple[ModuleArg, ...] = ()  # what the loaded modules were loaded with


def ready_fields(driver: ReadyDriver, *, install_dir_host: PurePosixPath, kernel_release: str,
                 installer_version: str, checks: Mapping[str, str] | None = None,
                 ) -> dict[str, object]:
    """The KEY=VALUE lines: the GPU operator's keys first, then ours. PENDING_DRIVER_VERSION:
    a version staged for the next boot while this one is in use (empty: none);
    NVIDIA_MODULE_ARGS: the parameters the loaded modules were loaded with; ``checks``
    (NVLINK_FABRIC, CUDA_CHECK, DAEMONS, ...: verify.CHECKS): what the verify saw before
    this file was written."""
    return {
        "IS_HOST_DRIVER": "true",
        "NVIDIA_DRIVER_ROOT": "/",
        "NVIDIA_DEV_ROOT": "/",
        "NVIDIA_DRIVER_VERSION": driver.driver_version or "",
        "NVIDIA_INSTALL_DIR_HOST": install_dir_host,
        "NVIDIA_BIN_DIR_HOST": install_dir_host / "bin",
        "NVIDIA_LIB_DIR_HOST": install_dir_host / "lib64",
        "NVIDIA_KERNEL_MODULE_TYPE": driver.module_type or "",
        "KERNEL_RELEASE": kernel_release,
        "GPU_COUNT": driver.gpu_count,
        "PERSISTENCE_MODE": driver.persistence_mode,
        "INSTALL_PLAN": driver.plan or "",
        "PENDING_DRIVER_VERSION": driver.pending_driver_version or "",
        "NVIDIA_MODULE_ARGS": " ".join(map(str, driver.module_args)),
        **(checks or {}),
        "INSTALLER_VERSION": installer_version,
        "READY_AT": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def loaded_module_args(fields: Mapping[str, str] | None) -> tuple[ModuleArg, ...] | None:
    """The module arguments a readiness file says the loaded driver was loaded with (None:
    it does not say, e.g. no file this boot, one an older installer wrote, or a list that
    is not of arguments)."""
    if not fields or "NVIDIA_MODULE_ARGS" not in fields:
        return None
    return parse_listed(fields["NVIDIA_MODULE_ARGS"])
