"""How many compile jobs fit in the container's memory limit.

A 96-CPU node gives ``--concurrency-level=96`` from the CPU count alone; each
kbuild job is a compiler process of its own, so under a 4 GiB limit the build
would be OOM-killed halfway. The jobs are therefore capped by the tightest
cgroup memory limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) between
this process's cgroup and the root, less a reserve for the installer itself,
divided by the peak memory of one job.
"""

from __future__ import annotations

from pathlib import Path

from installer.jail.cgroups import limit_dirs

# One kbuild job's peak: the largest resident set of any process of a `make -j1` build of
# NVIDIA's 535.261.03 kernel modules (proprietary tree, gcc-12, Debian 6.1 headers,
# conftest included), getrusage(RUSAGE_CHILDREN).ru_maxrss, measured on the CI machine
# (2026-11-23, 758 s): 239708 KiB (234 MiB). 1.6x that for other compilers (COS builds
# with clang) and larger kernels.
JOB_PEAK_BYTES = 384 << 20
# The installer (python), make and nvidia-installer themselves.
RESERVE_BYTES = 512 << 20
_UNLIMITED_V1 = 1 << 62  # v1 reports "no limit" as LONG_MAX rounded down to a page


def _limit(cgroup_dir: Path) -> int | None:
    for name in ("memory.max", "memory.limit_in_bytes"):
        try:
            text = (cgroup_dir / name).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < _UNLIMITED_V1:
            return int(text)
        return None  # "max", or v1's no-limit value
    return None


def memory_limit(cgroup_root: Path = Path("/sys/fs/cgroup"),
                 self_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    """The tightest memory limit on this process in bytes, or None when there is none."""
    limits = [x for d in limit_dirs("memory", ("memory",), cgroup_root, self_cgroup) if (x := _limit(d))]
    return min(limits) if limits else None


def jobs_for(cpus: int, limit: int | None, job_peak: int = JOB_PEAK_BYTES,
             reserve: int = RESERVE_BYTES) -> int:
    """min(CPUs, (limit - reserve) / per-job peak), at least 1."""
    if limit is None:
        return max(1, cpus)
    return max(1, min(cpus, (limit - reserve) // job_peak))
