"""The node's NVIDIA daemons as sidecars: run one, watch it, and say how it is.

The fabric manager (NVSwitch systems) and nvidia-persistenced run as native sidecars of the
DaemonSet (init containers with ``restartPolicy: Always``, as GKE and NVIDIA run them now).
Each sidecar is ``nvidia-driver-installer sidecar fabric-manager|persistenced``: it waits for
the driver, then runs NVIDIA's daemon and keeps ``<install-dir>/daemons/<name>.json`` up to
date: ``running`` with a heartbeat while it lives, ``exited`` with the exit status and the
last lines of its output when it dies, ``refused`` with the reason when it cannot start. The
installer's readiness and ``doctor`` read that file: another container of the pod cannot see
the daemon's process, but it sees the install dir.

The fabric manager runs in the foreground (``DAEMONIZE=0``, run_foreground). nvidia-persistenced
has no foreground mode: it always forks, and its parent exits once the child has written its
pid file (run_forking, forking.py); its messages go to syslog only, which the sidecar receives
on ``/dev/log`` and writes to the container's log.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import structlog

from installer.base import podcontract
from installer.base.dataclass import dataclass
from installer.base.errors import VerifyError
from installer.base.fsutil import write_atomic

log = structlog.get_logger(__name__)

STATE_DIR = "daemons"
# The registry is the pod contract's (podcontract.DAEMONS: light, read by --help).
DAEMONS = podcontract.DAEMONS
NAMES = podcontract.DAEMON_NAMES
FABRIC_MANAGER, PERSISTENCED = NAMES
RUNNING, EXITED, REFUSED, WAITING, IDLE = "running", "exited", "refused", "waiting", "idle"
HEARTBEAT_S = 5.0
STALE_S = 30.0  # a "running" state not refreshed for this long: the sidecar was killed
TAIL_LINES = 20


@dataclass(frozen=True)
class DaemonState:
    name: str
    state: str
    detail: str
    age_s: float

    def down(self) -> str | None:
        """Why the daemon is not running (None: it is, or it is waiting for the driver)."""
        if self.state in (EXITED, REFUSED):
            return self.detail
        if self.state == RUNNING and self.age_s > STALE_S:
            return f"{self.name}'s sidecar stopped reporting {self.age_s:.0f}s ago"
        return None


def state_file(install_root: Path, name: str) -> Path:
    return install_root / STATE_DIR / f"{name}.json"


def write_state(install_root: Path, name: str, state: str, detail: str = "") -> None:
    path = state_file(install_root, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"name": name, "state": state, "detail": detail,
                                   "pid": os.getpid()}) + "\n")


def read_state(install_root: Path, name: str, now: float | None = None) -> DaemonState | None:
    """The sidecar's last word (None: it never wrote one, e.g. no such sidecar)."""
    path = state_file(install_root, name)
    try:
        doc = json.loads(path.read_text(errors="replace")[:65536])
        age = (time.time() if now is None else now) - path.stat().st_mtime
        return DaemonState(name, str(doc["state"]), str(doc.get("detail", "")), age)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def wait_up(install_root: Path, names: Sequence[str], deadline_s: float, *,
            clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep) -> None:
    """Every named sidecar says ``running`` (or ``idle``: nothing to run on this node) within
    ``deadline_s``; VerifyError at once for one that died or refused, with its words."""
    end = clock() + deadline_s
    while True:
        states = {n: read_state(install_root, n) for n in names}
        for state in states.values():
            if state is not None and (why := state.down()):
                raise VerifyError(f"the {state.name} sidecar is not running: {why}",
                                  hint="read its log (kubectl logs <pod> -c nvidia-"
                                  f"{state.name}); the install is ready only with it up")
        pending = [n for n, s in states.items() if s is None or s.state not in (RUNNING, IDLE)]
        if not pending:
            return
        if clock() >= end:
            raise VerifyError(
                f"no word from the {', '.join(pending)} sidecar(s) within {deadline_s:g}s",
                hint="the DaemonSet must run them (manifests render --nvswitch / "
                "--persistenced), or drop them from NVIDIA_REQUIRED_DAEMONS")
        sleep(1.0)


def run_foreground(install_root: Path, name: str, argv: Sequence[str | os.PathLike[str]],
                   env: Mapping[str, str]) -> int:
    """Run the daemon until it exits, echoing its output; the state file says ``running``
    (refreshed every HEARTBEAT_S) and then ``exited`` with its status and output's tail."""
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    proc = subprocess.Popen([str(a) for a in argv], env={**os.environ, **env},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    reader = threading.Thread(target=_echo, args=(proc, tail), daemon=True)
    reader.start()
    log.info("daemon_started", daemon=name, pid=proc.pid, argv=[str(a) for a in argv])
    try:
        while proc.poll() is None:
            write_state(install_root, name, RUNNING, f"pid {proc.pid}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=HEARTBEAT_S)
    finally:
        if proc.poll() is None:  # we were stopped (SIGTERM from the kubelet): stop it too
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=5)
        last = " | ".join(line for line in tail if line.strip())[-1500:]
        write_state(install_root, name, EXITED,
                    f"{name} exited with status {proc.returncode}: {last or '(no output)'}")
    log.warning("daemon_exited", daemon=name, rc=proc.returncode)
    return proc.returncode


def idle(install_root: Path, name: str, why: str) -> None:
    """Nothing to run on this node (e.g. no NVSwitch in an NVSwitch pool): say so and stay
    up, as a sidecar must (one that exits is restarted), until the pod stops."""
    log.info("daemon_not_needed", daemon=name, reason=why)
    while True:
        write_state(install_root, name, IDLE, why)
        time.sleep(HEARTBEAT_S)


def _echo(proc: subprocess.Popen[str], tail: collections.deque[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        tail.append(line.rstrip("\n"))
        sys.stderr.write(line)
        sys.stderr.flush()
