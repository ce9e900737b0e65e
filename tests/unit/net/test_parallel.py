"""installer.net.parallel: several downloads at once, the first failure cancels the rest."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from werkzeug import Response

from installer.base.errors import DownloadError, UsageError
from installer.net.parallel import DownloadJob, download_all
from tests.unit.net.kit import FAST, seen

DEADLINE_S = 30


def test_download_all_runs_jobs_concurrently(server, session, tmp_path):
    """Each handler records when it started, then waits (up to a deadline) until all three
    have started: downloads run one after another would leave the first waiting alone, so
    its interval ends before the others start. Overlap is read from the recorded intervals,
    not from wall time."""
    spans: dict[str, list[float]] = {}
    lock = threading.Lock()
    all_in_flight = threading.Barrier(3)

    def slow(request):
        t0 = time.monotonic()
        with contextlib.suppress(threading.BrokenBarrierError):
            all_in_flight.wait(timeout=DEADLINE_S)
        with lock:
            spans[request.path] = [t0, time.monotonic()]
        return Response(request.path.encode() * 1000)

    for name in ("a", "b", "c"):
        server.expect_request(f"/{name}").respond_with_handler(slow)
    jobs = [DownloadJob(server.url_for(f"/{n}"), tmp_path / n, label=n, policy=FAST) for n in ("a", "b", "c")]

    results = download_all(session, jobs, max_workers=3)

    assert [r.path for r in results] == [tmp_path / n for n in ("a", "b", "c")]
    for n, r in zip("abc", results, strict=True):
        assert r.path.read_bytes() == f"/{n}".encode() * 1000
    starts = [s[0] for s in spans.values()]
    ends = [s[1] for s in spans.values()]
    assert len(spans) == 3
    assert max(starts) < min(ends), "the three requests were not in flight at the same time"


def test_download_all_first_failure_cancels_the_rest(server, session, tmp_path):
    progress = {"chunks": 0, "completed": False}
    streaming = threading.Event()

    def slow_stream(request):
        def body():
            for _ in range(100):
                progress["chunks"] += 1
                yield b"x" * 65536
                streaming.set()
                time.sleep(0.05)
            progress["completed"] = True

        return Response(body(), headers={"Content-Length": str(100 * 65536)})

    def fail_later(request):
        streaming.wait(timeout=DEADLINE_S)  # fail while /slow is mid-body
        return Response("gone", status=404)

    server.expect_request("/slow").respond_with_handler(slow_stream)
    server.expect_request("/missing").respond_with_handler(fail_later)
    jobs = [
        DownloadJob(server.url_for("/slow"), tmp_path / "slow", policy=FAST),
        DownloadJob(server.url_for("/missing"), tmp_path / "missing", policy=FAST),
        DownloadJob(server.url_for("/slow"), tmp_path / "queued", policy=FAST),
    ]

    with pytest.raises(DownloadError) as info:
        download_all(session, jobs, max_workers=2)

    assert "404" in info.value.message and "/missing" in info.value.message
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no dest, no .part
    assert not progress["completed"]
    assert [r.path for r in seen(server)].count("/slow") == 1  # the queued job never started


def test_download_all_rejects_duplicate_destinations(session, tmp_path):
    jobs = [DownloadJob("https://a/x", tmp_path / "x"), DownloadJob("https://b/x", tmp_path / "x")]
    with pytest.raises(UsageError):
        download_all(session, jobs)
    assert download_all(session, []) == []
