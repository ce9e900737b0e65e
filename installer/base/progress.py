"""Download progress: a live line on a terminal, sparse log events otherwise.

On a terminal (stderr is a tty) every active transfer shows in one updating
line (``driver.run  45.1%  212.3 MB/s  ETA 0:03``), redrawn at most every
0.2 s; parallel downloads share that line.

Otherwise (a pod: ``kubectl logs``) a ``download_progress`` event is logged at
most every ``interval_s`` (5 s) and when 25 %, 50 % and 75 % are crossed, with
percent, bytes, total, mb_per_s and eta_s, so a long download visibly moves.

Rates count only bytes received in this run (bytes kept from an earlier
attempt on a resume are not "speed").
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import IO

import structlog

log = structlog.get_logger(__name__)

MIB = 1024 * 1024
TTY_REDRAW_S = 0.2
LOG_INTERVAL_S = 5.0
MILESTONES = (25, 50, 75)


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "--:--"
    seconds = int(seconds + 0.5)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class _TtyBoard:
    """The one status line shared by all live transfers of this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bars: dict[int, str] = {}
        self.drawn = False

    def draw(self, key: int, text: str, stream: IO[str]) -> None:
        with self.lock:
            self.bars[key] = text
            self._render(stream)

    def remove(self, key: int, stream: IO[str]) -> None:
        with self.lock:
            self.bars.pop(key, None)
            if self.bars:
                self._render(stream)
            elif self.drawn:
                # Leave a clean line for whatever is logged next.
                self._write(stream, "\r\x1b[K")
                self.drawn = False

    def _render(self, stream: IO[str]) -> None:
        line = " | ".join(self.bars.values())
        self._write(stream, "\r\x1b[K" + line)
        self.drawn = True

    @staticmethod
    def _write(stream: IO[str], text: str) -> None:
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stderr must not break a download


_BOARD = _TtyBoard()


class Progress:
    """Progress of one transfer. Call :meth:`begin`, :meth:`advance`, :meth:`close`."""

    def __init__(
        self,
        *,
        label: str,
        url: str,
        stream: IO[str] | None = None,
        interactive: bool | None = None,
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.url = url
        self.stream = stream if stream is not None else sys.stderr
        if interactive is None:
            try:
                interactive = bool(self.stream.isatty())
            except (AttributeError, ValueError, OSError):
                interactive = False
        self.interactive = interactive
        self.interval_s = interval_s
        self.clock = clock
        self.total: int | None = None
        self.done = 0
        self._start_t = clock()
        self._start_bytes = 0  # bytes present when this run's rate counting started
        self._last_emit = self._start_t
        self._milestones_hit: set[int] = set()
        self._closed = False

    # -- state -------------------------------------------------------------------

    def begin(self, *, offset: int, total: int | None) -> None:
        """A response is about to stream: ``offset`` bytes are already there."""
        if total is not None:
            self.total = total
        if offset < self.done or offset == 0:
            # Restarted from scratch (or from less): rate counts from here.
            self._start_t = self.clock()
            self._start_bytes = offset
            pct = self._percent_of(offset)
            self._milestones_hit = {m for m in MILESTONES if pct is not None and pct >= m}
        self.done = offset

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        now = self.clock()
        if self.interactive:
            if now - self._last_emit >= TTY_REDRAW_S:
                self._last_emit = now
                _BOARD.draw(id(self), self._line(now), self.stream)
            return
        crossed = None
        pct = self._percent_of(self.done)
        if pct is not None:
            for m in MILESTONES:
                if pct >= m and m not in self._milestones_hit:
                    self._milestones_hit.add(m)
                    crossed = m
        if crossed is not None or now - self._last_emit >= self.interval_s:
            self._last_emit = now
            self._log(now)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.interactive:
            _BOARD.remove(id(self), self.stream)

    # -- figures -----------------------------------------------------------------

    def _percent_of(self, n: int) -> float | None:
        if not self.total:
            return None
        return min(100.0, 100.0 * n / self.total)

    def rate(self, now: float | None = None) -> float:
        """Bytes per second received in this run."""
        now = self.clock() if now is None else now
        dt = now - self._start_t
        return (self.done - self._start_bytes) / dt if dt > 0 else 0.0

    def eta(self, now: float | None = None) -> float | None:
        r = self.rate(now)
        if not self.total or r <= 0:
            return None
        return max(0.0, (self.total - self.done) / r)

    def _line(self, now: float) -> str:
        pct = self._percent_of(self.done)
        mbps = self.rate(now) / 1e6
        if pct is None:
            return f"{self.label}  {self.done / MIB:.1f} MiB  {mbps:.1f} MB/s"
        return f"{self.label}  {pct:5.1f}%  {mbps:.1f} MB/s  ETA {_fmt_eta(self.eta(now))}"

    def _log(self, now: float) -> None:
        pct = self._percent_of(self.done)
        eta = self.eta(now)
        log.info(
            "download_progress",
            label=self.label,
            url=self.url,
            percent=round(pct, 1) if pct is not None else None,
            bytes=self.done,
            total=self.total,
            mb_per_s=round(self.rate(now) / 1e6, 2),
            eta_s=round(eta, 1) if eta is not None else None,
        )
