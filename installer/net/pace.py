"""The bounds of one transfer over all its attempts: a deadline and a minimum rate.

A server that trickles a byte every few seconds passes every read timeout; these
(:class:`~installer.net.retry.TransferLimits`, from ``--download-deadline`` and
``--download-min-rate``) cut it off, for a download and a small fetch alike.
"""

from __future__ import annotations

import time

from installer.base.errors import DownloadError
from installer.net.retry import RetryPolicy, SlowTransferError, TransferLimits


class Pacer:
    """The deadline and minimum rate (TransferLimits) of one download, over all attempts."""

    def __init__(self, limits: TransferLimits, shown: str) -> None:
        self.limits = limits
        self.shown = shown
        self.deadline_at = time.monotonic() + limits.deadline_s
        self.received = 0  # bytes read from the network, every attempt
        self._window = (time.monotonic(), 0)

    def timeout(self, policy: RetryPolicy) -> tuple[float, float]:
        """The policy's (connect, read) timeouts, never past the deadline."""
        left = max(self.deadline_at - time.monotonic(), 0.1)
        return (min(policy.connect_timeout, left), min(policy.read_timeout, left))

    def begin_attempt(self) -> None:
        self.check_deadline()
        self._window = (time.monotonic(), self.received)

    def check_deadline(self) -> None:
        if time.monotonic() >= self.deadline_at:
            raise DownloadError(
                f"download of {self.shown} did not finish within its {self.limits.deadline_s:g}s "
                f"deadline ({round(self.received / 1e6, 1)} MB received)",
                hint="the server is too slow or stalls: use a closer mirror, or raise "
                "--download-deadline (DOWNLOAD_DEADLINE)",
                url=self.shown, limit="deadline")

    def pace(self, nbytes: int) -> None:
        """After each read of ``nbytes``: the deadline, then the rate over the last window."""
        self.received += nbytes
        self.check_deadline()
        since, at = self._window
        now = time.monotonic()
        if self.limits.min_rate and now - since >= self.limits.rate_time_s:
            rate = (self.received - at) / (now - since)
            if rate < self.limits.min_rate:
                raise SlowTransferError(rate, self.limits)
            self._window = (now, self.received)
