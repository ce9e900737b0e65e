"""Every external command goes through ``Runner``: argv lists, timeouts, captured output."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

DEFAULT_TIMEOUT_S = 300.0
STOP_GRACE_S = 5.0  # SIGTERM to the group, then SIGKILL: well inside the kubelet's 30 s


def stop_group(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Stop ``proc`` and its process group (TERM, then KILL after a grace); its output so far."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, STOP_GRACE_S)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            out, err = proc.communicate(timeout=wait)
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
    """Runs commands; keeps the total time spent in them (for overhead figures)."""

    total_s: float = 0.0
    count: int = 0

    def run(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        check: bool = True,
    ) -> CommandResult:
        args = tuple(str(a) for a in argv)
        full_env = {**os.environ, **(env or {})}
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
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                out, err = stop_group(proc)
                result = CommandResult(args, -9, out, err, 0.0)
                reason = f"timed out after {timeout:.0f}s"
            except BaseException:  # signals.Interrupted, KeyboardInterrupt: stop it all first
                stop_group(proc)
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
