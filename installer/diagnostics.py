"""What a failed run reports besides its error: the installer's and the kernel's log tails."""

from __future__ import annotations

import re

from installer.harvest import read_tail
from installer.installdir import InstallDir
from installer.runner import CommandError, Runner
from installer.visible import visible

# Failure classes where the kernel's own log usually says why.
KERNEL_LOG_CLASSES = {"module_load", "verify", "secure_boot", "build", "internal"}
KERNEL_LOG_PATTERN = re.compile(
    r"nvidia|nvrm|xid|module|lockdown|secure ?boot|signature|taint|firmware", re.IGNORECASE)
TAIL_LINES = 20


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


def kernel_log_tail(runner: Runner) -> list[str]:
    """The kernel log's relevant tail (``dmesg --ctime``), or why it cannot be read."""
    try:
        result = runner.run(["dmesg", "--ctime"], timeout=10, check=False)
    except CommandError as exc:
        return [f"(kernel log not readable: {exc.reason})"]
    if result.returncode != 0:
        why = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        return [f"(kernel log not readable: {why})"]
    relevant = [ln for ln in result.stdout.splitlines() if KERNEL_LOG_PATTERN.search(ln)]
    # Never other lines instead: a NIC or USB message beside a build error misleads.
    return relevant[-TAIL_LINES:] or ["(no NVIDIA or kernel module lines in the kernel log)"]


def failure_details(install: InstallDir, runner: Runner, error_class: str,
                    since_wall: float) -> dict[str, list[str]]:
    """What goes into the final event and status.json next to the error itself."""
    details: dict[str, list[str]] = {}
    tail = installer_log_tail(install, since_wall)
    if tail:
        details["installer_log_tail"] = tail
    if error_class in KERNEL_LOG_CLASSES:
        details["kernel_log_tail"] = kernel_log_tail(runner)
    return details
