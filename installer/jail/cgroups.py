"""The cgroup directories whose limits apply to this process (the build's CPU quota and
memory limit are both read from them)."""

from __future__ import annotations

from pathlib import Path


def limit_dirs(controller: str, v1_mounts: tuple[str, ...], cgroup_root: Path,
               self_cgroup: Path) -> list[Path]:
    """Dirs whose ``controller`` limits cap this process: the mounted root of each
    hierarchy (the container's own cgroup under a cgroup namespace) and, when the host's
    hierarchy is mounted instead, our cgroup from /proc/self/cgroup and its ancestors.
    ``v1_mounts``: the controller's v1 mount names under ``cgroup_root``."""
    v1_roots = [cgroup_root / name for name in v1_mounts]
    dirs = [cgroup_root, *v1_roots]
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            bases = [cgroup_root]  # v2 unified
        elif controller in controllers.split(","):
            bases = v1_roots
        else:
            continue
        names = [p for p in path.split("/") if p and p not in (".", "..")]
        for base in bases:
            dirs += [base.joinpath(*names[:n]) for n in range(len(names), 0, -1)]
    return list(dict.fromkeys(dirs))
