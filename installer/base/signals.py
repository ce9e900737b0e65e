"""SIGTERM and SIGINT: stop cleanly, exit 143 / 130.

The kubelet deleting the pod sends SIGTERM (SIGKILL follows after the grace
period); Ctrl-C sends SIGINT. The handler raises :class:`Interrupted` in the
main thread, and the run unwinds as for any failure: the Runner stops its
child's whole process group, the install discards its staging dir (the last
good install stays), the host lock is released by its ``with`` block, and the
CLI logs a final event and exits 128 + the signal number.

A second signal while unwinding is ignored, so the cleanup finishes. Code that
must not be cut in half (the swap of a new install into place) runs inside
:func:`deferred`: a signal arriving there is acted on when it ends.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import Any

HANDLED = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """Raised by the handler. A BaseException, like KeyboardInterrupt: ``except
    Exception`` blocks (bugs, retries) must not swallow it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by {self.name}")


class _State:
    unwinding = False
    deferring = 0
    pending: int | None = None


def _handler(signum: int, _frame: Any) -> None:
    if _State.unwinding:
        return
    if _State.deferring:
        _State.pending = signum
        return
    _State.unwinding = True
    raise Interrupted(signum)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Install the handlers for the duration (the CLI's whole run); restore the old ones."""
    _State.unwinding, _State.deferring, _State.pending = False, 0, None
    previous: dict[signal.Signals, Callable[..., Any] | int | None] = {}
    try:
        for sig in HANDLED:
            previous[sig] = signal.signal(sig, _handler)
    except ValueError:  # not the main thread (an embedder): leave signals alone
        pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGTERM/SIGINT until the block is done (it is short and must not be cut)."""
    _State.deferring += 1
    try:
        yield
    finally:
        _State.deferring -= 1
        if not _State.deferring and _State.pending is not None and not _State.unwinding:
            signum, _State.pending = _State.pending, None
            _State.unwinding = True
            raise Interrupted(signum)
