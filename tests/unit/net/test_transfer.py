"""installer.net.transfer against a real HTTPS server on 127.0.0.1 (private trustme CA).

The server is pytest-httpserver (werkzeug) with TLS; Range answers come from
werkzeug's own ``make_conditional``. Drops are a response body generator that
raises after N bytes (the server closes the connection mid-body); stalls are a
generator that sleeps past the client's read timeout.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
import time
from collections import namedtuple
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs
from werkzeug import Request, Response

from installer.base.errors import DiskSpaceError, DownloadError, IntegrityError, UsageError
from installer.net import retry, sinks, transfer
from installer.net.retry import RetryPolicy
from installer.net.session import make_session
from installer.net.transfer import download
from tests.unit.net.kit import FAST, PAYLOAD, PAYLOAD_SHA, no_part_files, ranged, seen

REPO = Path(__file__).resolve().parents[3]


def dropping(payload: bytes, drop_at: int, *, start: int = 0, stall_s: float = 0.0) -> Response:
    """A body announced in full that stops after ``drop_at`` bytes (connection closed)."""

    def body():
        yield payload[start:drop_at]
        if stall_s:
            time.sleep(stall_s)
        raise ConnectionAbortedError("test server: dropping the connection")

    headers = {"Content-Length": str(len(payload) - start), "Accept-Ranges": "bytes"}
    status = 200
    if start:
        status = 206
        headers["Content-Range"] = f"bytes {start}-{len(payload) - 1}/{len(payload)}"
    return Response(body(), status=status, headers=headers, direct_passthrough=True)


# --------------------------------------------------------------------------- success


def test_download_is_byte_identical_with_correct_sha256(server, session, tmp_path):
    server.expect_request("/drv/file.run").respond_with_handler(ranged)
    dest = tmp_path / "out" / "file.run"

    with capture_logs() as logs:
        got = download(
            session,
            server.url_for("/drv/file.run"),
            dest,
            expected_sha256=PAYLOAD_SHA.upper(),
            policy=FAST,
        )

    assert dest.read_bytes() == PAYLOAD
    assert got.sha256 == PAYLOAD_SHA == hashlib.sha256(dest.read_bytes()).hexdigest()
    assert (got.path, got.size, got.resumed_bytes) == (dest, len(PAYLOAD), 0)
    assert got.elapsed_s > 0
    reqs = seen(server)
    assert len(reqs) == 1
    assert reqs[0].headers.get("Accept-Encoding") == "identity"
    assert "Range" not in reqs[0].headers
    assert reqs[0].headers["User-Agent"].startswith("nvidia-driver-installer/")
    assert no_part_files(dest.parent)
    finished = [e for e in logs if e["event"] == "download_finished"]
    assert len(finished) == 1
    assert finished[0]["sha256"] == PAYLOAD_SHA and finished[0]["size"] == len(PAYLOAD)
    assert finished[0]["resumed_bytes"] == 0 and finished[0]["mb_per_s"] > 0
    assert any(e["event"] == "download_started" for e in logs)


def test_sha256_mismatch_leaves_nothing_and_keeps_previous_file(server, session, tmp_path):
    server.expect_request("/f").respond_with_handler(ranged)
    dest = tmp_path / "f"
    dest.write_bytes(b"previous good file")
    wrong = "0" * 64

    with pytest.raises(IntegrityError) as info:
        download(session, server.url_for("/f"), dest, expected_sha256=wrong, policy=FAST)

    err = info.value
    assert err.exit_code == 6
    assert server.url_for("/f") in err.message
    assert wrong in err.message and PAYLOAD_SHA in err.message
    assert dest.read_bytes() == b"previous good file"
    assert no_part_files(tmp_path)
    assert len(seen(server)) == 1  # a checksum mismatch is not retried


def test_bad_expected_sha256_is_a_usage_error(server, session, tmp_path):
    with pytest.raises(UsageError):
        download(session, server.url_for("/f"), tmp_path / "f", expected_sha256="abc")
    assert seen(server) == []


def test_unknown_length_chunked_body(server, session, tmp_path):
    def chunked(request):
        return Response(PAYLOAD[i : i + 7000] for i in range(0, len(PAYLOAD), 7000))

    server.expect_request("/f").respond_with_handler(chunked)
    got = download(session, server.url_for("/f"), tmp_path / "f", policy=FAST)
    assert "Content-Length" not in server.log[0][1].headers
    assert got.sha256 == PAYLOAD_SHA and (tmp_path / "f").read_bytes() == PAYLOAD


# --------------------------------------------------------------------------- HTTP errors


def test_503_twice_then_200_succeeds_after_three_requests(server, session, tmp_path, no_sleep):
    answers = iter([503, 503])

    def handler(request):
        status = next(answers, None)
        return Response("busy", status=status) if status else ranged(request)

    server.expect_request("/f").respond_with_handler(handler)
    got = download(session, server.url_for("/f"), tmp_path / "f", policy=FAST)

    assert got.sha256 == PAYLOAD_SHA
    assert len(seen(server)) == 3
    assert len(no_sleep) == 2


@pytest.mark.parametrize("status", [401, 403, 404, 410])
def test_client_errors_fail_at_once(server, session, tmp_path, status, no_sleep):
    server.expect_request("/drivers/550.54.15/NVIDIA.run").respond_with_data("no", status=status)
    url = server.url_for("/drivers/550.54.15/NVIDIA.run")

    with pytest.raises(DownloadError) as info:
        download(session, url, tmp_path / "NVIDIA.run", policy=FAST)

    assert len(seen(server)) == 1
    assert no_sleep == []
    assert info.value.exit_code == 5
    assert url in info.value.message and str(status) in info.value.message
    if status == 404:
        assert "driver version" in info.value.hint
    assert list(tmp_path.iterdir()) == []


def test_retries_exhausted_names_the_attempt_limit(server, session, tmp_path, no_sleep):
    server.expect_request("/f").respond_with_data("down", status=503)
    policy = RetryPolicy(3, 0.01, 0.02, 30, 3, 3)

    with pytest.raises(DownloadError) as info:
        download(session, server.url_for("/f"), tmp_path / "f", policy=policy)

    msg = info.value.message
    assert len(seen(server)) == 3
    assert "attempt limit reached (3 attempts" in msg
    assert "HTTP 503" in msg and server.url_for("/f") in msg
    assert isinstance(info.value.__cause__, retry.TransientHTTPError)
    assert list(tmp_path.iterdir()) == []


def test_retries_exhausted_names_the_total_timeout(server, session, tmp_path):
    server.expect_request("/f").respond_with_data("down", status=502)
    policy = RetryPolicy(1000, 0.05, 0.05, 0.4, 3, 3)  # real (tiny) sleeps

    with pytest.raises(DownloadError) as info:
        download(session, server.url_for("/f"), tmp_path / "f", policy=policy)

    assert "total timeout reached (0.4s" in info.value.message
    assert "HTTP 502" in info.value.message
    assert 2 <= len(seen(server)) < 1000


# --------------------------------------------------------------------------- resume


def test_dropped_connection_resumes_with_range_for_the_missing_bytes_only(server, session, tmp_path):
    drop_at = 123_457
    state = {"dropped": False}

    def handler(request):
        if not state["dropped"]:
            state["dropped"] = True
            return dropping(PAYLOAD, drop_at)
        return ranged(request)

    server.expect_request("/f").respond_with_handler(handler)
    with capture_logs() as logs:
        got = download(session, server.url_for("/f"), tmp_path / "f", policy=FAST)

    assert (tmp_path / "f").read_bytes() == PAYLOAD
    assert got.sha256 == PAYLOAD_SHA
    reqs = seen(server)
    assert [r.headers.get("Range") for r in reqs] == [None, f"bytes={drop_at}-"]
    second = server.log[1][1]
    assert second.status_code == 206
    assert int(second.headers["Content-Length"]) == len(PAYLOAD) - drop_at
    assert got.resumed_bytes == drop_at
    retries = [e for e in logs if e["event"] == "download_retry"]
    assert len(retries) == 1 and retries[0]["attempt"] == 1
    assert "wait_s" in retries[0] and "Connection broken" in retries[0]["cause"]


def test_server_ignoring_range_restarts_cleanly(server, session, tmp_path):
    state = {"dropped": False}

    def handler(request):
        if not state["dropped"]:
            state["dropped"] = True
            return dropping(PAYLOAD, 100_000)
        return Response(PAYLOAD)  # 200, whole body, Range ignored

    server.expect_request("/f").respond_with_handler(handler)
    with capture_logs() as logs:
        got = download(
            session, server.url_for("/f"), tmp_path / "f", expected_sha256=PAYLOAD_SHA, policy=FAST
        )

    assert (tmp_path / "f").read_bytes() == PAYLOAD
    assert got.resumed_bytes == 0
    assert [r.headers.get("Range") for r in seen(server)] == [None, "bytes=100000-"]
    restarts = [e for e in logs if e["event"] == "download_restart"]
    assert [e["reason"] for e in restarts] == ["range_ignored"]


def test_416_restarts_from_zero(server, session, tmp_path):
    state = {"dropped": False}

    def handler(request):
        if not state["dropped"]:
            state["dropped"] = True
            return dropping(PAYLOAD, 50_000)
        if request.headers.get("Range"):
            return Response("", status=416)
        return Response(PAYLOAD)

    server.expect_request("/f").respond_with_handler(handler)
    got = download(session, server.url_for("/f"), tmp_path / "f", policy=FAST)

    assert got.sha256 == PAYLOAD_SHA and (tmp_path / "f").read_bytes() == PAYLOAD
    assert [r.headers.get("Range") for r in seen(server)] == [None, "bytes=50000-", None]


def test_206_at_the_wrong_offset_is_not_appended(server, session, tmp_path):
    state = {"n": 0}

    def handler(request):
        state["n"] += 1
        if state["n"] == 1:
            return dropping(PAYLOAD, 70_000)
        if request.headers.get("Range"):
            return dropping(PAYLOAD, len(PAYLOAD), start=60_000)  # overlaps: wrong start
        return Response(PAYLOAD)

    server.expect_request("/f").respond_with_handler(handler)
    with capture_logs() as logs:
        got = download(session, server.url_for("/f"), tmp_path / "f", policy=FAST)

    assert (tmp_path / "f").read_bytes() == PAYLOAD and got.sha256 == PAYLOAD_SHA
    assert [r.headers.get("Range") for r in seen(server)] == [None, "bytes=70000-", None]
    assert [e["reason"] for e in logs if e["event"] == "download_restart"] == ["content_range_mismatch"]


def test_if_range_sent_when_server_gave_a_validator(server, session, tmp_path):
    state = {"dropped": False}

    def handler(request):
        if not state["dropped"]:
            state["dropped"] = True
            resp = dropping(PAYLOAD, 40_000)
            resp.headers["ETag"] = '"v1"'
            return resp
        resp = Response(PAYLOAD)
        resp.set_etag("v1")
        return resp.make_conditional(request, accept_ranges=True, complete_length=len(PAYLOAD))

    server.expect_request("/f").respond_with_handler(handler)
    got = download(session, server.url_for("/f"), tmp_path / "f", policy=FAST)

    assert got.sha256 == PAYLOAD_SHA and got.resumed_bytes == 40_000
    assert seen(server)[1].headers.get("If-Range") == '"v1"'


def test_stalled_body_hits_read_timeout_and_resumes(server, session, tmp_path):
    state = {"stalled": False}

    def handler(request):
        if not state["stalled"]:
            state["stalled"] = True
            return dropping(PAYLOAD, 80_000, stall_s=1.5)
        return ranged(request)

    server.expect_request("/f").respond_with_handler(handler)
    policy = RetryPolicy(3, 0.01, 0.02, 30, 2, 0.3)
    with capture_logs() as logs:
        got = download(session, server.url_for("/f"), tmp_path / "f", policy=policy)

    assert got.sha256 == PAYLOAD_SHA
    assert [r.headers.get("Range") for r in seen(server)] == [None, "bytes=80000-"]
    (retry_event,) = [e for e in logs if e["event"] == "download_retry"]
    assert "timed out" in retry_event["cause"].lower()


DROP_PAYLOAD = random.Random(99).randbytes(64 * 1024 + 17)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(drop_at=st.integers(min_value=1, max_value=len(DROP_PAYLOAD) - 1))
def test_resume_property_any_drop_offset(server, session, tmp_path, drop_at):
    server.clear()
    state = {"dropped": False}

    def handler(request):
        if not state["dropped"]:
            state["dropped"] = True
            return dropping(DROP_PAYLOAD, drop_at)
        return ranged(request, DROP_PAYLOAD)

    server.expect_request("/p").respond_with_handler(handler)
    dest = tmp_path / f"p-{drop_at}"
    got = download(session, server.url_for("/p"), dest, policy=FAST)

    assert dest.read_bytes() == DROP_PAYLOAD
    assert got.sha256 == hashlib.sha256(DROP_PAYLOAD).hexdigest()
    assert [r.headers.get("Range") for r in seen(server)] == [None, f"bytes={drop_at}-"]
    assert got.resumed_bytes == drop_at
    dest.unlink()


def test_file_url_copies_with_sha256(tmp_path):
    src = tmp_path / "staged" / "NVIDIA.run"
    src.parent.mkdir()
    src.write_bytes(PAYLOAD * 5)  # > CHUNK_SIZE is not needed; several reads are
    dest = tmp_path / "out" / "NVIDIA.run"

    got = download(None, src.as_uri(), dest, expected_sha256=hashlib.sha256(PAYLOAD * 5).hexdigest())

    assert dest.read_bytes() == PAYLOAD * 5
    assert got.size == len(PAYLOAD) * 5 and got.resumed_bytes == 0
    assert no_part_files(dest.parent)

    with pytest.raises(IntegrityError):
        download(None, src.as_uri(), tmp_path / "out" / "other", expected_sha256="1" * 64)
    assert not (tmp_path / "out" / "other").exists() and no_part_files(dest.parent)


def test_file_url_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope" / "NVIDIA.run"
    with pytest.raises(DownloadError) as info:
        download(None, missing.as_uri(), tmp_path / "out")
    assert str(missing) in info.value.message and info.value.exit_code == 5
    assert not (tmp_path / "out").exists() and no_part_files(tmp_path)


# --------------------------------------------------------------------------- disk space


def test_disk_space_checked_against_content_length(server, session, tmp_path, monkeypatch):
    server.expect_request("/f").respond_with_handler(ranged)
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(sinks.shutil, "disk_usage", lambda p: Usage(10**9, 10**9, 200_000))

    with pytest.raises(DiskSpaceError) as info:
        download(session, server.url_for("/f"), tmp_path / "f", policy=FAST)

    err = info.value
    assert err.exit_code == 11
    assert "0.3 MB" in err.message and "0.2 MB available" in err.message
    assert len(seen(server)) == 1  # not retried
    assert list(tmp_path.iterdir()) == []


def test_disk_space_includes_min_free_bytes(server, session, tmp_path, monkeypatch):
    server.expect_request("/f").respond_with_handler(ranged)
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(sinks.shutil, "disk_usage", lambda p: Usage(10**9, 0, len(PAYLOAD) + 1000))

    with pytest.raises(DiskSpaceError):
        download(session, server.url_for("/f"), tmp_path / "f", min_free_bytes=5000, policy=FAST)
    got = download(session, server.url_for("/f"), tmp_path / "f", min_free_bytes=500, policy=FAST)
    assert got.size == len(PAYLOAD)


def test_enospc_while_writing_is_disk_space_error(server, session, tmp_path, monkeypatch):
    """Injected ENOSPC (runs everywhere; the tmpfs test below is the real thing)."""
    server.expect_request("/f").respond_with_handler(ranged)
    opened: list[Path] = []
    real_open = sinks._open_part

    class Filling:
        def __init__(self, fh):
            self.fh, self.written = fh, 0

        def write(self, data):
            if self.written + len(data) > 100_000:
                raise OSError(28, "No space left on device")
            self.written += len(data)
            return self.fh.write(data)

        def __getattr__(self, name):
            return getattr(self.fh, name)

    def fake_open(path):
        opened.append(path)
        return Filling(real_open(path))

    monkeypatch.setattr(sinks, "_open_part", fake_open)
    with pytest.raises(DiskSpaceError) as info:
        download(session, server.url_for("/f"), tmp_path / "f", policy=FAST)

    assert "disk full" in info.value.message
    assert opened and not opened[0].exists()
    assert len(seen(server)) == 1


ENOSPC_CHILD = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    from installer.net.retry import RetryPolicy
    from installer.net.session import make_session
    from installer.net.transfer import download
    url, ca, target = sys.argv[2], sys.argv[3], Path(sys.argv[4])
    s = make_session()
    s.verify = ca
    out = {"free": os.statvfs(target).f_bavail * os.statvfs(target).f_frsize}
    try:
        download(s, url, target / "big.bin", policy=RetryPolicy(2, 0.01, 0.01, 10, 3, 3))
        out["error"] = None
    except Exception as exc:
        import traceback; traceback.print_exc()
        out.update(error=type(exc).__name__, exit_code=int(getattr(exc, "exit_code", -1)),
                   message=str(exc))
    out["left"] = sorted(os.listdir(target))
    print(json.dumps(out))
    """
)


def _can_unshare_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, timeout=10
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _can_unshare_mount(), reason="needs root and unshare --mount")
@pytest.mark.parametrize("with_length", [False, True], ids=["chunked-enospc", "precheck"])
def test_real_full_tmpfs(server, clean_env, ca_bundle, tmp_path, with_length):
    big = random.Random(7).randbytes(4 * 1024 * 1024)
    if with_length:
        server.expect_request("/big").respond_with_handler(lambda r: ranged(r, big))
    else:

        def chunked(request):
            def body():
                for i in range(0, len(big), 256 * 1024):
                    yield big[i : i + 256 * 1024]

            return Response(body())  # no Content-Length: chunked, size unknown up front

        server.expect_request("/big").respond_with_handler(chunked)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = tmp_path / "child.py"
    script.write_text(ENOSPC_CHILD)
    cmd = (
        f"mount -t tmpfs -o size=1m tmpfs {mnt} && "
        f"exec {sys.executable} {script} {REPO} {server.url_for('/big')} {ca_bundle} {mnt}"
    )
    res = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", cmd],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["free"] <= 1024 * 1024
    assert out["error"] == "DiskSpaceError", res.stderr
    assert out["error"] == "DiskSpaceError" and out["exit_code"] == 11
    assert out["left"] == []  # temp file removed, nothing at dest
    if with_length:
        assert "available" in out["message"]
        assert len(seen(server)) == 1
    else:
        assert "disk full" in out["message"]


# --------------------------------------------------------------------------- credentials


def test_credentials_never_logged_or_in_errors(server, session, tmp_path):
    server.expect_request("/f").respond_with_data("no", status=404)
    port = server.port
    url = f"https://alice:hunter2secret@127.0.0.1:{port}/f?X-Goog-Signature=deadbeefcafe&v=2"

    with capture_logs() as logs, pytest.raises(DownloadError) as info:
        download(session, url, tmp_path / "f", policy=FAST)

    text = json.dumps([{k: str(v) for k, v in e.items()} for e in logs]) + str(info.value)
    text += json.dumps({k: str(v) for k, v in info.value.context.items()})
    assert "hunter2secret" not in text and "deadbeefcafe" not in text and "alice" not in text
    assert f"https://***@127.0.0.1:{port}/f?X-Goog-Signature=***&v=***" in info.value.message
    assert seen(server)[0].headers.get("Authorization", "").startswith("Basic ")


def test_credentials_scrubbed_from_connection_error_causes(clean_env, tmp_path, no_sleep):
    # Nothing listens on this port: urllib3's message repeats the path and query.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"https://127.0.0.1:{port}/f?token=topsecretvalue"
    with capture_logs() as logs, pytest.raises(DownloadError) as info:
        download(make_session(), url, tmp_path / "f", policy=RetryPolicy(2, 0, 0, 10, 1, 1))
    text = str(info.value) + json.dumps([{k: str(v) for k, v in e.items()} for e in logs])
    assert "topsecretvalue" not in text
    assert "attempt limit reached (2 attempts" in str(info.value)
    assert "ConnectionError" in str(info.value)


def test_large_download_logs_progress_events(server, session, tmp_path, monkeypatch):
    big = random.Random(3).randbytes(4 * transfer.CHUNK_SIZE)
    server.expect_request("/big").respond_with_handler(lambda r: ranged(r, big))
    with capture_logs() as logs:
        download(session, server.url_for("/big"), tmp_path / "big", policy=FAST)
    events = [e for e in logs if e["event"] == "download_progress"]
    assert [e["percent"] for e in events] == [25.0, 50.0, 75.0]


# --------------------------------------------------------------------------- hostile servers


def _with_limits(session, **kw):
    session.transfer_limits = retry.TransferLimits(**kw)
    return session


def trickle(request: Request) -> Response:
    def body():
        for _ in range(100):
            yield b"x"
            time.sleep(0.2)

    return Response(body(), headers={"Content-Length": "100"}, direct_passthrough=True)


def test_download_deadline_cuts_a_trickling_body(server, session, tmp_path):
    server.expect_request("/slow.run").respond_with_handler(trickle)
    start = time.monotonic()
    with pytest.raises(DownloadError, match=r"did not finish within its 1s deadline") as err:
        download(_with_limits(session, deadline_s=1, min_rate=0), server.url_for("/slow.run"),
                 tmp_path / "slow.run", policy=FAST)
    assert time.monotonic() - start < 3
    assert err.value.exit_code == 5
    assert no_part_files(tmp_path)


def test_minimum_rate_cuts_an_attempt_and_retries(server, session, tmp_path, no_sleep):
    server.expect_request("/slow.run").respond_with_handler(trickle)
    with pytest.raises(DownloadError, match=r"slower than 1000 B/s") as err:
        download(_with_limits(session, min_rate=1000, rate_time_s=0.5),
                 server.url_for("/slow.run"), tmp_path / "slow.run",
                 policy=RetryPolicy(2, 0.01, 0.01, 30, 3, 3))
    assert err.value.context["attempts"] == 2


@pytest.mark.parametrize("body", [b"\x1f\x8b" + b"\0" * 64, b"not gzip at all"])
def test_content_encoded_bodies_are_refused(server, session, tmp_path, body):
    server.expect_request("/enc.run").respond_with_data(body, headers={"Content-Encoding": "gzip"})
    with pytest.raises(DownloadError, match="'gzip'-encoded body"):
        download(session, server.url_for("/enc.run"), tmp_path / "enc.run", policy=FAST)
    assert no_part_files(tmp_path)


def test_an_implausible_size_is_not_reported_as_a_full_disk(server, session, tmp_path):
    def huge(request: Request) -> Response:
        return Response(iter([b"x"]), headers={"Content-Length": str(10**15)},
                        direct_passthrough=True)

    server.expect_request("/huge.run").respond_with_handler(huge)
    with pytest.raises(DownloadError, match="announced 1000000000000000 bytes"):
        download(session, server.url_for("/huge.run"), tmp_path / "huge.run", policy=FAST)


def test_a_fifo_behind_a_file_url_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(DownloadError, match="not a regular file"):
        download(None, f"file://{tmp_path}/fifo", tmp_path / "out", policy=FAST)
