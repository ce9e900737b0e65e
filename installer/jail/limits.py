"""The jail's cgroups: a child of ours in every hierarchy we are in, the limits one level
above the jail's cgroup-namespace root, where the jail cannot reach them.

RLIMIT_NPROC bounds nothing here: the jail runs as uid 0, and the kernel never applies
it to the init user (kernel/fork.c copy_process: ``p->real_cred->user != INIT_USER``),
whatever its capabilities. So the process bound is ``pids.max`` on a cgroup below ours
(which the container's memory limit already bounds). The layout, in every hierarchy of
/proc/self/cgroup that is mounted (cgroup v1: pids, memory, freezer, cpu, cpuset, ...;
the v2 hierarchy, hybrid's ``unified`` included):

    <our cgroup>/ndi-jail-<id>/        the limit (pids.max), never seen by the jail
    <our cgroup>/ndi-jail-<id>/jail/   the jail's processes: its cgroup-namespace root

``<id>`` is our PID and a random tag (``cgroup_name``): a PID alone repeats across PID
namespaces, so two installers whose PID namespaces differ but whose cgroup is the same
(two test pods of one runner, a DaemonSet pod and a debugging run beside it in one
container) would both make ``ndi-jail-7``, and the second would run unbounded.

bwrap unshares the jail's cgroup namespace after its first process entered ``jail/`` in
each hierarchy, so a cgroupfs the jail could mount would have ``jail/`` as its root:
neither the limit above it nor the container's own files (``memory.limit_in_bytes``,
``freezer.state``: docs/jail.md, J2/J3) are in it. (The seccomp filter refuses the mount in
the first place: jail/seccomp.py.)

- cgroup v1: plain dirs; a new cpuset gets its parent's ``cpus`` and ``mems`` (a cpuset
  without them takes no process); where our memory cgroup is flat (``use_hierarchy``
  0, kernels before 5.11), ``ndi-jail-<id>`` gets our memory limit itself.
- cgroup v2: with the pids controller, *threaded* children, because our own cgroup holds
  our processes and the no-internal-process rule forbids a domain child with a domain
  controller; pids is a threaded controller, which may be enabled on a cgroup with
  processes (Documentation/admin-guide/cgroup-v2.rst, "Threads"). Our cgroup becomes a
  threaded domain while the jail runs and is set back after. Without it, plain children
  (no controller is enabled for them, so the rule does not apply).

Where the pids child cannot be made (no pids controller, a read-only cgroupfs, a cgroup
that cannot be a thread root) the jail runs without the bound and the reason is
reported (docs/jail.md); a hierarchy where no child can be made is named too.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import field
from pathlib import Path

from installer.base.dataclass import dataclass

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
RMDIR_TRIES, RMDIR_WAIT_S = 1000, 0.001  # up to ~1 s: the jail's last exits
INNER = "jail"  # the jail's cgroup-namespace root, below the one with the limit


def cgroup_name() -> str:
    """The name of this jail's cgroup: unique among jails that share our cgroup (the
    module docstring says why the PID alone is not)."""
    return f"ndi-jail-{os.getpid()}-{os.urandom(4).hex()}"


@dataclass
class JailCgroups:
    procs: list[Path] = field(default_factory=list)  # cgroup.procs the jail's first process writes "0" to
    why_not: str = ""  # why there is no pids bound ("" when there is)
    shared: list[str] = field(default_factory=list)  # hierarchies with no child of ours, and why


@dataclass
class Hierarchy:
    own: Path  # our cgroup's dir in it
    controllers: tuple[str, ...]  # () for v2
    v2: bool = False


def _own_dir(base: Path, path: str) -> Path:
    """Our cgroup under the mounted hierarchy ``base``: ``path`` from /proc/self/cgroup
    when that is what is mounted, else the mount's root (a cgroup namespace, or a runtime
    that mounts only the container's own cgroup)."""
    names = [p for p in path.split("/") if p and p not in (".", "..")]
    own = base.joinpath(*names)
    return own if names and own.is_dir() else base


def _v1_mount(cgroup_root: Path, controllers: str) -> Path | None:
    """Where a v1 hierarchy is mounted: ``cpu,cpuacct`` or one of its names (``name=x``:
    ``x``)."""
    names = [c.removeprefix("name=") for c in controllers.split(",")]
    for name in (",".join(names), *names):
        if (cgroup_root / name / "cgroup.procs").is_file():
            return cgroup_root / name
    return None


def hierarchies(cgroup_root: Path = CGROUP_ROOT,
                self_cgroup: Path = SELF_CGROUP) -> list[Hierarchy]:
    """Every mounted hierarchy we are in, and our cgroup in it."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return []
    found: dict[Path, Hierarchy] = {}
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers:
            base = _v1_mount(cgroup_root, controllers)
            if base is not None:
                found.setdefault(_own_dir(base, path), Hierarchy(
                    _own_dir(base, path), tuple(controllers.split(","))))
            continue
        for base in (cgroup_root, cgroup_root / "unified"):
            if (base / "cgroup.controllers").is_file():
                found.setdefault(_own_dir(base, path), Hierarchy(_own_dir(base, path), (), True))
                break
    return list(found.values())


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _v2_pids(own: Path) -> bool:
    with contextlib.suppress(OSError):
        return "pids" in (own / "cgroup.controllers").read_text().split()
    return False


def _make(h: Hierarchy, name: str, limit: int, undo: list[Callable[[], None]]) -> bool:
    """Our cgroup's child ``name`` and its ``jail/`` in hierarchy ``h``; whether the pids
    limit is set on ``name``. Each step's undo is appended (OSError: stopped there)."""
    outer, inner = h.own / name, h.own / name / INNER
    pids = "pids" in h.controllers or (h.v2 and _v2_pids(h.own))
    if h.v2 and pids and "pids" not in (h.own / "cgroup.subtree_control").read_text().split():
        _write(h.own / "cgroup.subtree_control", "+pids")
        undo.append(lambda: _write(h.own / "cgroup.subtree_control", "-pids"))
    for d in (outer, inner):
        d.mkdir()
        undo.append(functools.partial(_rmdir_when_empty, d))
        if h.v2 and pids:
            _write(d / "cgroup.type", "threaded")
        if "cpuset" in h.controllers:
            for knob in ("cpuset.cpus", "cpuset.mems"):
                _write(d / knob, (d.parent / knob).read_text().strip())
    if pids:
        _write(outer / "pids.max", str(limit))
    if "memory" in h.controllers and _read(h.own / "memory.use_hierarchy") == "0":
        # A kernel before 5.11 may leave v1 memcgs flat: a child would not be held by
        # our limit, so it gets it itself (mm/memcontrol.c, "use_hierarchy").
        _write(outer / "memory.limit_in_bytes", _read(h.own / "memory.limit_in_bytes"))
    return pids


@contextlib.contextmanager
def jail_cgroups(limit: int, name: str, cgroup_root: Path = CGROUP_ROOT,
                 self_cgroup: Path = SELF_CGROUP) -> Iterator[JailCgroups]:
    """The jail's cgroups (the module docstring) for the time of the block, removed after
    (its processes are gone by then: the jail's PID namespace died with its init)."""
    made = JailCgroups(why_not="no pids cgroup controller is mounted for this process")
    undo: list[Callable[[], None]] = []
    try:
        for h in hierarchies(cgroup_root, self_cgroup):
            steps: list[Callable[[], None]] = []
            undo.append(functools.partial(_undo, steps))
            try:
                if _make(h, name, limit, steps):
                    made.why_not = ""
                made.procs.append(h.own / name / INNER / "cgroup.procs")
            except OSError as exc:
                _undo(steps)
                steps.clear()
                made.shared.append(f"{h.own}: {exc.strerror}")
                if "pids" in h.controllers or (h.v2 and _v2_pids(h.own)):
                    made.why_not = f"cannot make a pids cgroup in {h.own}: {exc.strerror}"
        yield made
    finally:
        _undo(undo)


def _undo(steps: list[Callable[[], None]]) -> None:
    for step in reversed(steps):
        with contextlib.suppress(OSError):
            step()


def _rmdir_when_empty(jail: Path) -> None:
    """rmdir, a few tries: the last of the jail's processes may still be exiting (EBUSY)."""
    for _ in range(RMDIR_TRIES - 1):
        try:
            jail.rmdir()
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            time.sleep(RMDIR_WAIT_S)
    jail.rmdir()


def enter(made: JailCgroups) -> None:
    """In the jail's first process, before exec: into ``jail/`` in every hierarchy (all it
    starts follows, and bwrap's cgroup namespace is rooted there)."""
    for procs in made.procs:
        _write(procs, "0")
