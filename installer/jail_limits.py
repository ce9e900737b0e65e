"""The jail's process bound: a pids cgroup of its own, below ours, where one can be made.

RLIMIT_NPROC bounds nothing here: the jail runs as uid 0, and the kernel never applies
it to the init user (kernel/fork.c copy_process: ``p->real_cred->user != INIT_USER``),
whatever its capabilities. So the bound is a cgroup with ``pids.max``, made below the
cgroup we are in (which the container's memory limit already bounds):

- cgroup v1: a new dir in the pids hierarchy;
- cgroup v2: a *threaded* child, because our own cgroup holds our processes and the
  no-internal-process rule forbids a domain child of it; pids is a threaded controller,
  which may be enabled on a cgroup with processes (Documentation/admin-guide/
  cgroup-v2.rst, "Threads"). Our cgroup becomes a threaded domain while the jail runs
  and is set back after.

Where neither works (no pids controller, a read-only cgroupfs, a cgroup that cannot be
a thread root) the jail runs without one and the reason is reported (docs/jail.md).
"""

from __future__ import annotations

import contextlib
import errno
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
RMDIR_TRIES, RMDIR_WAIT_S = 1000, 0.001  # up to ~1 s: the jail's last exits


@dataclass
class PidsBound:
    procs: Path | None  # the cgroup.procs the jail's first process writes "0" to
    why_not: str = ""  # when procs is None


def _own_dir(base: Path, path: str) -> Path:
    """Our cgroup under the mounted hierarchy ``base``: ``path`` from /proc/self/cgroup
    when that is what is mounted, else the mount's root (a cgroup namespace, or a runtime
    that mounts only the container's own cgroup)."""
    names = [p for p in path.split("/") if p and p not in (".", "..")]
    own = base.joinpath(*names)
    return own if names and own.is_dir() else base


def _hierarchy(cgroup_root: Path, self_cgroup: Path) -> tuple[Path, bool] | None:
    """(our cgroup dir with the pids controller, whether it is cgroup v2), if any."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if "pids" in controllers.split(",") and (cgroup_root / "pids").is_dir():
            return _own_dir(cgroup_root / "pids", path), False
    for line in lines:
        if line.startswith("0::"):
            own = _own_dir(cgroup_root, line[3:])
            with contextlib.suppress(OSError):
                if "pids" in (own / "cgroup.controllers").read_text().split():
                    return own, True
    return None


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


@contextlib.contextmanager
def pids_cgroup(limit: int, name: str, cgroup_root: Path = CGROUP_ROOT,
                self_cgroup: Path = SELF_CGROUP) -> Iterator[PidsBound]:
    """A cgroup ``name`` below ours with ``pids.max`` = ``limit`` for the time of the
    block, removed after (its processes are gone by then: the jail's PID namespace died
    with its init)."""
    found = _hierarchy(cgroup_root, self_cgroup)
    if found is None:
        yield PidsBound(None, "no pids cgroup controller is mounted for this process")
        return
    own, v2 = found
    jail = own / name
    undo: list[Callable[[], None]] = []
    try:
        try:
            if v2 and "pids" not in (own / "cgroup.subtree_control").read_text().split():
                _write(own / "cgroup.subtree_control", "+pids")
                undo.append(lambda: _write(own / "cgroup.subtree_control", "-pids"))
            jail.mkdir()
            undo.append(lambda: _rmdir_when_empty(jail))
            if v2:
                _write(jail / "cgroup.type", "threaded")
            _write(jail / "pids.max", str(limit))
        except OSError as exc:
            yield PidsBound(None, f"cannot make a pids cgroup in {own}: {exc.strerror}")
            return
        yield PidsBound(jail / "cgroup.procs")
    finally:
        for step in reversed(undo):
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


def enter(bound: PidsBound) -> None:
    """In the jail's first process, before exec: into the cgroup (all it starts follows)."""
    if bound.procs is not None:
        _write(bound.procs, "0")
