"""A daemon that forks itself away, run as a sidecar: nvidia-persistenced.

NVIDIA's nvidia-persistenced has no foreground mode (its options: ``-v -h -V -u -g
--persistence-mode --no-persistence-mode --nvidia-cfg-path``; an unknown one prints
``ERROR: Invalid commandline`` and exits 0). It always daemonizes: the parent forks and exits
once the child has written and locked ``/var/run/nvidia-persistenced/nvidia-persistenced.pid``
and bound ``/var/run/nvidia-persistenced/socket``, 0 when the child is up, 1 ("failed to
initialize. Check syslog for more details.") when it is not; the child closes its standard
files and logs to syslog only (NVIDIA/nvidia-persistenced, tag 535.171.04:
nvidia-persistenced.c ``daemonize``/``main``, nvpd_defs.h). NVIDIA's own systemd unit runs it
so (``Type=forking``, init/systemd).

So the sidecar: becomes the child's reaper (PR_SET_CHILD_SUBREAPER: the orphaned daemon is
reparented to it, and its exit status reaches it), binds ``/dev/log`` when nothing is there
and writes each syslog message to the container's log as a ``daemon_syslog`` event, runs the
daemon, waits (bounded) for its pid file, then watches that pid for as long as the pod lives.
A daemon that fails to start or dies makes the sidecar exit 9 with one line saying why (the
kubelet restarts it); the state file says ``exited`` with the same words.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from installer.base.dataclass import dataclass
from installer.base.errors import VerifyError
from installer.services import supervise as daemons

log = structlog.get_logger(__name__)

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
STOP_S = 10.0
PID_FILE_S = 5.0
PID_MAX_LIMIT = 4 * 1024 * 1024  # the kernel's ceiling (include/linux/threads.h, 64-bit)
RESTART_HINT = ("the sidecar exits so that the kubelet restarts it; read its daemon_syslog "
                "lines (kubectl logs <pod> -c nvidia-persistenced)")
SEVERITIES = ("emerg", "alert", "crit", "err", "warning", "notice", "info", "debug")
# glibc's syslog(3) datagram: "<PRI>Mmm dd hh:mm:ss TAG[PID]: message" (misc/syslog.c);
# nvidia-persistenced opens it with no LOG_PID, so there is no [PID].
_SYSLOG_LINE = re.compile(r"<(\d{1,3})>(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d )?"
                          r"([^:\[\s]+)(?:\[\d+\])?: ?(.*)", re.S)


@dataclass(frozen=True)
class Watch:
    """Where the forked daemon says it is up, and how long it may take to say so."""
    pid_file: Path
    socket: Path | None
    start_s: float


def parse_syslog(datagram: bytes) -> tuple[str, str, str]:
    """(severity, tag, message) of one syslog datagram; unparsed text as ("info", "", text)."""
    text = datagram.decode(errors="replace").rstrip("\n\0")
    m = _SYSLOG_LINE.fullmatch(text)
    if not m:
        return "info", "", text.strip()
    return SEVERITIES[int(m.group(1)) & 7], m.group(2), m.group(3).strip()


class SyslogRelay:
    """``/dev/log`` bound by the sidecar: each message becomes a ``daemon_syslog`` event on
    stderr (the container's log) and goes into ``tail`` for the exit reason."""

    def __init__(self, path: Path, name: str, tail: collections.deque[str]) -> None:
        self.path, self.name, self.tail = path, name, tail
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        os.chmod(path, 0o666)  # the daemon may drop to another user (-u)
        self.sock.settimeout(0.5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._relay, daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, path: Path, name: str, tail: collections.deque[str]) -> SyslogRelay | None:
        """The relay, or None where ``path`` is taken (a node's own syslog socket: the
        daemon's messages go there) or cannot be bound."""
        if os.path.lexists(path) and not _dead_socket(path):
            log.info("daemon_syslog_elsewhere", daemon=name, path=str(path))
            return None
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a dead one: ours, left by a sidecar that was killed
        try:
            return cls(path, name, tail)
        except OSError as exc:
            log.warning("daemon_syslog_unrelayed", daemon=name, path=str(path), error=str(exc))
            return None

    def _relay(self) -> None:
        while not self._stop.is_set():
            try:
                datagram = self.sock.recv(8192)
            except TimeoutError:
                continue
            except OSError:
                return
            severity, tag, message = parse_syslog(datagram)
            self.tail.append(message)
            emit = log.warning if severity in SEVERITIES[:5] else log.info
            emit("daemon_syslog", daemon=self.name, severity=severity, tag=tag, message=message)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


def _dead_socket(path: Path) -> bool:
    """A socket file (not a link: a node's /dev/log is one) that nobody receives on."""
    if path.is_symlink() or not stat.S_ISSOCK(path.lstat().st_mode):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return False


def become_subreaper() -> bool:
    """Orphaned descendants (the forked daemon) become our children (Linux 3.4+)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def exit_status(pid: int) -> str | None:
    """None while ``pid`` lives; how it ended once it is gone ("status 1", "signal
    SIGKILL"; "unknown status" for one that was not our child)."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "unknown status"
        except PermissionError:
            return None
        return None
    if got == 0:
        return None
    code = os.waitstatus_to_exitcode(status)
    return f"status {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"


def read_pid(pid_file: Path) -> int | None:
    """The pid a daemon's pid file names; None for none, or for anything but a pid above 1
    and at most the kernel's ceiling (0 or -1 would make kill and waitpid act on a whole
    group, a huge number overflows them: a pid file is the daemon's to write, not ours to
    trust)."""
    try:
        text = pid_file.read_text(errors="replace")[:32].strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and 1 < int(text) <= PID_MAX_LIMIT else None


def pid_alive(pid: int, proc_dir: Path = Path("/proc")) -> bool:
    """Whether ``pid`` runs: not gone and no zombie. A daemonized process is re-parented to
    the container's init, maybe this process: reap it if so; a zombie answers kill(pid, 0)."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat_line = (proc_dir / str(pid) / "stat").read_text()
    except OSError:
        return True
    return stat_line.rpartition(")")[2].split()[:1] != ["Z"]


def stop_pid(pid: int, wait_s: float) -> None:
    """SIGTERM (a daemon removes its pid file and socket), up to ``wait_s`` for it to go,
    then SIGKILL and up to ``wait_s`` more: bounded, as every wait here (one stuck in the
    kernel outlives both; the container's end takes it)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        end = time.monotonic() + wait_s
        while pid_alive(pid):
            if time.monotonic() >= end:
                break
            time.sleep(0.1)
        else:
            return


def said(tail: collections.deque[str]) -> str:
    """The daemon's last words on one line (copied first: the relay thread appends)."""
    return " | ".join(tail.copy())[-1500:] or "(no output)"


def _start(name: str, argv: Sequence[str], env: Mapping[str, str], watch: Watch,
           tail: collections.deque[str]) -> int:
    """Run the daemon's parent to its exit, then wait for the pid file: the child's pid."""
    try:
        proc = subprocess.run(argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, errors="replace",
                              timeout=watch.start_s)
    except subprocess.TimeoutExpired as exc:
        raise VerifyError(f"{name} did not finish starting within {watch.start_s:g}s",
                          hint=RESTART_HINT) from exc
    output = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    for line in output:
        sys.stderr.write(line + "\n")
    tail.extend(output)
    if proc.returncode != 0:  # 1: "failed to initialize"; the reason is in its syslog
        time.sleep(0.3)  # the child's last syslog lines
        raise VerifyError(f"{name} exited with status {proc.returncode}: "
                          f"{said(tail)}", hint=RESTART_HINT)
    # NVIDIA's parent exits 0 only after its child wrote and locked the pid file (daemonize,
    # then init_complete): a short bound is enough. A pid file of a dead daemon (a restarted
    # container) does not count.
    end = time.monotonic() + min(watch.start_s, PID_FILE_S)
    while (pid := read_pid(watch.pid_file)) is None or exit_status(pid) is not None:
        if time.monotonic() >= end:
            raise VerifyError(f"{name} exited with status 0 but no daemon wrote "
                              f"{watch.pid_file}: {said(tail)}", hint=RESTART_HINT)
        time.sleep(0.2)
    return pid


def run_forking(install_root: Path, name: str, argv: Sequence[str | os.PathLike[str]],
                env: Mapping[str, str], watch: Watch, syslog_path: Path | None) -> int:
    """Start the forking daemon and watch it while it lives; never returns while it does.
    VerifyError (exit 9) once it failed to start or died, with the state file saying so.
    The caller (the sidecar's CLI) has made this process a subreaper (become_subreaper)."""
    tail: collections.deque[str] = collections.deque(maxlen=daemons.TAIL_LINES)
    relay = SyslogRelay.open(syslog_path, name, tail) if syslog_path else None
    words = [str(a) for a in argv]
    pid = None
    try:
        log.info("daemon_starting", daemon=name, argv=words)
        pid = _start(name, words, env, watch, tail)
        log.info("daemon_started", daemon=name, pid=pid, pid_file=str(watch.pid_file))
        while (status := exit_status(pid)) is None:
            sock = "" if watch.socket is None or watch.socket.exists() else ", no socket"
            daemons.write_state(install_root, name, daemons.RUNNING, f"pid {pid}{sock}")
            time.sleep(daemons.HEARTBEAT_S)
        time.sleep(0.3)  # its last syslog lines
        raise VerifyError(f"{name} (pid {pid}) exited with {status}: {said(tail)}",
                          hint=RESTART_HINT)
    except VerifyError as exc:
        daemons.write_state(install_root, name, daemons.EXITED, exc.message)
        pid = None
        raise
    finally:
        if pid is not None and exit_status(pid) is None:  # we were stopped: stop it too
            stop_pid(pid, STOP_S)
            daemons.write_state(install_root, name, daemons.EXITED,
                                f"{name} (pid {pid}) stopped with its sidecar")
        if relay is not None:
            relay.close()
