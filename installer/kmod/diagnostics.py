"""What a failed run reports besides its error: the installer's and the kernel's log tails,
and the one reader of the kernel log (doctor and the module loader read it here too)."""

from __future__ import annotations

import re
from pathlib import Path

from installer.host.installdir import InstallDir
from installer.host.runner import CommandError, Runner
from installer.jail.harvest import read_tail
from installer.jail.visible import visible
from installer.kmod import xid
from installer.kmod.kernel import KernelState

# Failure classes where the kernel's own log usually says why.
KERNEL_LOG_CLASSES = {"module_load", "verify", "secure_boot", "build", "internal"}
KERNEL_LOG_PATTERN = re.compile(
    r"nvidia|nvrm|xid|module|lockdown|secure ?boot|signature|taint|firmware", re.IGNORECASE)
TAIL_LINES = 20
RUNNING_KERNEL_DEV = Path("/dev")


def installer_log_tail(install: InstallDir, since_wall: float) -> list[str]:
    """Last lines of the nvidia-installer.log this run wrote (not an older run's)."""
    candidates = [install.staging_dir / "nvidia-installer.log",
                  install.installer_log.with_name("nvidia-installer.failed.log"),
                  install.installer_log,
                  install.staging_dir / "installer-output.log"]
    fresh = []
    for path in candidates:
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        if mtime >= since_wall - 1:
            fresh.append((mtime, path))
    if not fresh:
        return []
    path = max(fresh)[1]
    # A tail, never the whole: the jail may have printed 200 MiB; each line made visible
    # (names and lines NVIDIA's code chose go into the final event and status.json).
    lines = [visible(ln) for ln in read_tail(path).rstrip().splitlines()[-TAIL_LINES:]]
    return [f"({path.name})", *lines]


def read_kernel_log(kernel: KernelState, runner: Runner) -> list[xid.Record] | str:
    """The kernel log's records: ``/dev/kmsg`` under the kernel roots, else ``dmesg --raw``
    (its ``<prio>`` keeps the facility; ``--facility=kern`` keeps the kernel's own), or
    why neither can be read. dmesg reads the kernel this process runs on, so it is asked
    only when the roots are the running kernel's (never for a test's fake node)."""
    kmsg = kernel.dev_dir / "kmsg"
    records = xid.read_kmsg(kmsg)
    if records is not None:
        return records
    if kernel.dev_dir != RUNNING_KERNEL_DEV:
        return f"{kmsg} cannot be read"
    try:
        result = runner.run(["dmesg", "--raw", "--facility=kern"], timeout=10, check=False)
    except CommandError as exc:
        return exc.reason
    if result.returncode != 0:
        return (result.stderr.strip().splitlines() or [f"dmesg: exit {result.returncode}"])[-1]
    return xid.parse_dmesg_raw(result.stdout[-xid.MAX_BYTES:])[-xid.MAX_RECORDS:]


def _source(message: str) -> str:
    """Who logged a kernel record: printk messages lead with their source (``NVRM: ...``,
    ``nvidia: Unknown symbol ...``, ``Lockdown: insmod: ...``), and a message without one is
    the kernel's own words (``Loading of unsigned module is rejected``). Only that part is
    matched: the rest may quote a user's text (``tmpfs: Unknown parameter 'NVRM: ...'``)."""
    return message.split(": ", 1)[0]


def kernel_log_tail(kernel: KernelState, runner: Runner) -> list[str]:
    """The kernel log's relevant tail (the kernel's own records), or why it cannot be read."""
    records = read_kernel_log(kernel, runner)
    if isinstance(records, str):
        return [f"(kernel log not readable: {records})"]
    relevant = [r.show() for r in records
                if r.from_kernel and KERNEL_LOG_PATTERN.search(_source(r.message))]
    # Never other lines instead: a NIC or USB message beside a build error misleads.
    return relevant[-TAIL_LINES:] or ["(no NVIDIA or kernel module lines in the kernel log)"]


def failure_details(install: InstallDir, kernel: KernelState, runner: Runner,
                    error_class: str, since_wall: float) -> dict[str, list[str]]:
    """What goes into the final event and status.json next to the error itself."""
    details: dict[str, list[str]] = {}
    tail = installer_log_tail(install, since_wall)
    if tail:
        details["installer_log_tail"] = tail
    if error_class in KERNEL_LOG_CLASSES:
        details["kernel_log_tail"] = kernel_log_tail(kernel, runner)
    return details
