"""Every external command goes through ``Runner``: argv lists, timeouts, captured output."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import IO

import structlog

from installer.base.dataclass import dataclass
from installer.base.errors import clip

log = structlog.get_logger(__name__)

DEFAULT_TIMEOUT_S = 300.0
STOP_GRACE_S = 5.0  # SIGTERM to the group, then SIGKILL: well inside the kubelet's 30 s
HEARTBEAT_S = 30.0  # a long-running command logs that it is alive this often
HEARTBEAT_LINE_CHARS = 160
TAIL_READ_BYTES = 4096


def stop_group(proc: subprocess.Popen[str],
               collect: Callable[[float], tuple[str, str]] | None = None) -> tuple[str, str]:
    """Stop ``proc`` and its process group (TERM, then KILL after a grace); its output so far
    (``collect(wait)``: by default ``communicate``)."""
    collect = collect or (lambda wait: proc.communicate(timeout=wait))
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, STOP_GRACE_S)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            out, err = collect(wait)
            return out or "", err or ""
        except subprocess.TimeoutExpired:
            continue
    # Something outside the group holds the pipes open: give up on the output.
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    proc.wait()
    return "", ""


def tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def last_line(path: Path) -> str:
    """The last non-empty line of the file's last few KiB ("" if none or unreadable)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_READ_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")


class _Pumps:
    """Both pipes read on threads as the output comes (no deadlock on large output, the
    whole output kept for the error tail) and the last non-empty line at hand."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.chunks: dict[str, list[str]] = {"out": [], "err": []}
        self.last = ""
        self.threads = [threading.Thread(target=self._read, args=(pipe, self.chunks[key]),
                                         daemon=True)
                        for key, pipe in (("out", proc.stdout), ("err", proc.stderr))]
        for thread in self.threads:
            thread.start()

    def _read(self, pipe: IO[str], into: list[str]) -> None:
        with contextlib.suppress(OSError, ValueError):  # closed under us by stop_group
            for line in pipe:
                into.append(line)
                if line.strip():
                    self.last = line.strip()

    def output(self, wait: float | None = None) -> tuple[str, str]:
        for thread in self.threads:
            thread.join(wait)
        return "".join(self.chunks["out"]), "".join(self.chunks["err"])

    def collect(self, wait: float) -> tuple[str, str]:
        """For stop_group: the output once the process has exited (TimeoutExpired if not)."""
        self.proc.wait(wait)
        return self.output(wait)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _wait_alive(proc: subprocess.Popen[str], pumps: _Pumps, *, timeout: float, every: float,
                name: str, watch: Sequence[Path]) -> None:
    """Wait for ``proc``, logging ``still_running`` every ``every`` seconds with the elapsed
    time and the last output line (of the newest ``watch`` file, else of the pipes)."""
    start = time.monotonic()
    while True:
        left = start + timeout - time.monotonic()
        try:
            proc.wait(timeout=max(0.0, min(every, left)))
            return
        except subprocess.TimeoutExpired:
            if left <= every:
                raise
        stamped = [(t, p) for p in watch if (t := _mtime(p)) is not None]
        line = (last_line(max(stamped)[1]) if stamped else "") or pumps.last
        log.info("still_running", command=name, elapsed_s=round(time.monotonic() - start),
                 last_line=clip(line, HEARTBEAT_LINE_CHARS) or None)


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float


class CommandError(Exception):
    """A command failed: carries argv, exit code and the output's tail."""

    def __init__(self, result: CommandResult, reason: str | None = None) -> None:
        self.result = result
        self.argv = result.argv
        self.returncode = result.returncode
        self.stdout = result.stdout
        self.stderr = result.stderr
        self.reason = reason or f"exited with {result.returncode}"
        super().__init__(f"{result.argv[0]} {self.reason}: {self.stderr_tail(3) or '(no output)'}")

    def stderr_tail(self, lines: int = 20) -> str:
        return tail(self.stderr or self.stdout, lines)


@dataclass
class Runner:
    """Runs commands; keeps the total time spent in them (for overhead figures). ``env``:
    what every command's environment gets on top of ours (detect.context: the kernel
    seams, empty on a real node), as cloud-init's one ``subp`` owns the child's env."""

    heartbeat_s: float = HEARTBEAT_S
    total_s: float = 0.0
    count: int = 0
    env: Mapping[str, str] = field(default_factory=dict)

    def run(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        check: bool = True,
        long_running: str | None = None,
        watch: Sequence[Path] = (),
    ) -> CommandResult:
        """Run ``argv``. ``long_running`` (the name to show) makes it log a heartbeat every
        ``heartbeat_s`` with the last line of its output or of the ``watch`` files."""
        args = tuple(str(a) for a in argv)
        full_env = {**os.environ, **self.env, **(env or {})}
        log.debug("command_started", argv=list(args))
        start = time.monotonic()
        reason = None
        try:
            # Its own session and process group: a timeout or our own SIGTERM stops the
            # command and everything it started (make, cc, the sandbox's children).
            proc = subprocess.Popen(
                args, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
        except FileNotFoundError as exc:
            result = CommandResult(args, 127, "", f"{args[0]}: command not found ({exc})", 0.0)
            reason = "was not found"
        else:
            pumps = _Pumps(proc) if long_running else None
            collect = pumps.collect if pumps else None
            try:
                if pumps:
                    _wait_alive(proc, pumps, timeout=timeout, every=self.heartbeat_s,
                                name=long_running or args[0], watch=watch)
                    out, err = pumps.output()
                else:
                    out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                out, err = stop_group(proc, collect)
                result = CommandResult(args, -9, out, err, 0.0)
                reason = f"timed out after {timeout:.0f}s"
            except BaseException:  # signals.Interrupted, KeyboardInterrupt: stop it all first
                stop_group(proc, collect)
                raise
            else:
                result = CommandResult(args, proc.returncode, out, err, 0.0)
        duration = time.monotonic() - start
        result = CommandResult(result.argv, result.returncode, result.stdout, result.stderr,
                               duration)
        self.total_s += duration
        self.count += 1
        log.debug("command_finished", argv=list(args), rc=result.returncode,
                  duration_s=round(duration, 3))
        if reason is not None or (check and result.returncode != 0):
            raise CommandError(result, reason)
        return result
