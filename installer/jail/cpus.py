"""How many CPUs this container may really use (the build's -j): its affinity, capped by
the cgroup v2/v1 CPU quotas between its own cgroup and the root."""

from __future__ import annotations

import math
import os
from pathlib import Path

from installer.jail.cgroups import limit_dirs


def _quota_cpus(cgroup_dir: Path) -> int | None:
    """ceil(quota / period) of a v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``; None if unlimited."""
    try:
        q, p = (cgroup_dir / "cpu.max").read_text().split()[:2]
        quota, period = (None, None) if q == "max" else (int(q), int(p))
    except (OSError, ValueError):
        try:
            quota = int((cgroup_dir / "cpu.cfs_quota_us").read_text())
            period = int((cgroup_dir / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            return None
    if not quota or not period or quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def usable_cpus(cgroup_root: Path = Path("/sys/fs/cgroup"),
                self_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """CPUs this container may really use: affinity, capped by every cgroup v2/v1 CPU
    quota between its own cgroup and the root (the tightest one wins)."""
    cpus = len(os.sched_getaffinity(0))
    dirs = limit_dirs("cpu", ("cpu", "cpu,cpuacct"), cgroup_root, self_cgroup)
    quotas = [q for d in dirs if (q := _quota_cpus(d))]
    if quotas:
        cpus = min(cpus, *quotas)
    return max(1, cpus)
