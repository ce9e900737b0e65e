"""installer.base.progress: what a download shows while it runs."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from installer.base.progress import Progress


def test_progress_logs_sparsely_when_not_a_terminal():
    now = [0.0]

    class NotTty:
        def isatty(self):
            return False

    p = Progress(label="drv", url="https://h/x", stream=NotTty(), clock=lambda: now[0])
    assert p.interactive is False
    with capture_logs() as logs:
        p.begin(offset=0, total=10**9)
        for _ in range(100):  # 10 MB per 0.1 s: 10 s in all
            now[0] += 0.1
            p.advance(10**7)
        p.close()
    events = [e for e in logs if e["event"] == "download_progress"]
    pcts = [e["percent"] for e in events]
    # 25/50/75 % milestones plus one "5 s passed" event at 50 % (the same moment).
    assert {25.0, 50.0, 75.0} <= set(pcts)
    assert len(events) <= 5
    assert all(e["mb_per_s"] == pytest.approx(100.0) for e in events)
    assert events[0]["eta_s"] == pytest.approx(7.5, abs=0.2)


def test_progress_draws_one_line_on_a_terminal():
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    now = [0.0]
    p = Progress(label="drv", url="u", stream=out, clock=lambda: now[0])
    with capture_logs() as logs:
        p.begin(offset=0, total=10_000_000)
        for _ in range(10):
            now[0] += 0.5
            p.advance(1_000_000)
        p.close()
    text = out.getvalue()
    assert "\n" not in text and text.count("\r") >= 10
    assert "100.0%" in text and "MB/s" in text and "ETA" in text
    assert text.endswith("\r\x1b[K")
    assert not [e for e in logs if e["event"] == "download_progress"]
