"""installer.net.retry: what is retried, how long it waits, how it gives up."""

from __future__ import annotations

import email.utils
import ssl
import time
from datetime import UTC, datetime, timedelta

import pytest
import requests
import urllib3.exceptions
from structlog.testing import capture_logs
from werkzeug import Response

from installer.base.errors import DiskSpaceError, DownloadError, IntegrityError, UsageError
from installer.detect import context
from installer.net import retry
from installer.net.retry import (
    NETWORK_DEFAULTS,
    RetryPolicy,
    TransientHTTPError,
    is_transient,
    network_retryer,
    parse_retry_after,
    with_settings,
)
from installer.net.transfer import download
from installer.settings import Settings, retry_env, validate

PAYLOAD = b"0123456789" * 1000




# --------------------------------------------------------------------------- Retry-After


def test_429_retry_after_seconds_is_honoured(server, session, tmp_path, waits):
    answers = iter([Response("slow down", status=429, headers={"Retry-After": "7"})])
    server.expect_request("/f").respond_with_handler(lambda r: next(answers, Response(PAYLOAD)))
    policy = RetryPolicy(3, 0.01, 20, 60, 3, 3)

    got = download(session, server.url_for("/f"), tmp_path / "f", policy=policy)

    assert got.size == len(PAYLOAD)
    assert len(waits) == 1
    assert 7.0 <= waits[0] <= 7.7  # never earlier than asked; spread by up to 10 %
    assert len(server.log) == 2


def test_retry_after_http_date_and_cap(server, session, tmp_path, waits):
    when = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=12), usegmt=True)
    answers = iter(
        [
            Response("", status=503, headers={"Retry-After": when}),
            Response("", status=429, headers={"Retry-After": "3600"}),
        ]
    )
    server.expect_request("/f").respond_with_handler(lambda r: next(answers, Response(PAYLOAD)))
    policy = RetryPolicy(4, 0.01, 15, 60, 3, 3)

    download(session, server.url_for("/f"), tmp_path / "f", policy=policy)

    assert len(waits) == 2
    assert 9.0 <= waits[0] <= 12.5 * 1.1  # the date has 1 s resolution; +10 % spread
    assert waits[1] == 15.0  # capped by wait_max


def test_parse_retry_after():
    now = datetime(2024, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after("Mon, 01 Jan 2024 12:00:30 GMT", now=now) == 30.0
    assert parse_retry_after("Mon, 01 Jan 2024 11:00:00 GMT", now=now) == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after("") is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("-5") is None


# --------------------------------------------------------------------------- classification


@pytest.mark.parametrize(
    "exc",
    [
        TransientHTTPError(503),
        TransientHTTPError(429, retry_after=1),
        requests.exceptions.ConnectionError("refused"),
        requests.exceptions.ConnectTimeout("slow"),
        requests.exceptions.ReadTimeout("slow"),
        requests.exceptions.ChunkedEncodingError("cut"),
        urllib3.exceptions.ProtocolError("Connection broken"),
        urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out"),
        retry.IncompleteBodyError(10, 20),
        requests.exceptions.SSLError("EOF occurred in violation of protocol"),
    ],
)
def test_transient(exc):
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        DownloadError("HTTP 404"),
        IntegrityError("sha256 mismatch"),
        DiskSpaceError("full"),
        UsageError("bad"),
        requests.exceptions.SSLError(
            ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] verify failed")
        ),
        requests.exceptions.InvalidURL("x"),
        ValueError("bug"),
    ],
)
def test_not_transient(exc):
    assert not is_transient(exc)


# --------------------------------------------------------------------------- the retryer


def test_backoff_grows_with_jitter_within_bounds(waits):
    policy = RetryPolicy(6, 1.0, 5.0, 1e6, 1, 1)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 6:
            raise requests.exceptions.ConnectionError("reset")
        return "ok"

    with capture_logs() as logs:
        assert network_retryer(policy, url="https://h/x")(flaky) == "ok"

    bases = [1, 2, 4, 5, 5]
    assert len(waits) == 5
    for w, base in zip(waits, bases, strict=True):
        assert base / 2 <= w <= base
    events = [e for e in logs if e["event"] == "download_retry"]
    assert [e["attempt"] for e in events] == [1, 2, 3, 4, 5]
    assert all(e["url"] == "https://h/x" and e["cause"] == "ConnectionError: reset" for e in events)
    assert [e["wait_s"] for e in events] == [round(w, 3) for w in waits]


def test_non_transient_error_propagates_unchanged(waits):
    calls = []
    err = IntegrityError("sha256 mismatch")

    def bad():
        calls.append(1)
        raise err

    with pytest.raises(IntegrityError) as info:
        network_retryer(RetryPolicy(5, 0.01, 0.01, 10, 1, 1))(bad)
    assert info.value is err and len(calls) == 1 and waits == []


def test_give_up_after_attempts_names_limit_and_cause(waits):
    def always():
        raise requests.exceptions.ReadTimeout("Read timed out. (read timeout=60)")

    with pytest.raises(DownloadError) as info:
        network_retryer(RetryPolicy(3, 0.01, 0.01, 100, 1, 1), url="https://h/f")(always)

    msg = info.value.message
    assert "attempt limit reached (3 attempts, DOWNLOAD_RETRIES)" in msg
    assert "ReadTimeout: Read timed out" in msg and "https://h/f" in msg
    assert info.value.exit_code == 5 and len(waits) == 2
    assert isinstance(info.value.__cause__, requests.exceptions.ReadTimeout)


def test_give_up_on_total_timeout_before_sleeping_past_it():
    calls = []

    def always():
        calls.append(time.monotonic())
        raise TransientHTTPError(503, "Service Unavailable")

    t0 = time.monotonic()
    with pytest.raises(DownloadError) as info:
        network_retryer(RetryPolicy(100, 0.1, 0.1, 0.35, 1, 1))(always)
    elapsed = time.monotonic() - t0

    assert "total timeout reached (0.35s, DOWNLOAD_TIMEOUT)" in info.value.message
    assert "HTTP 503 Service Unavailable" in info.value.message
    assert 2 <= len(calls) <= 8
    assert elapsed < 2.0  # never slept past the budget by a whole backoff step


# --------------------------------------------------------------------------- environment


@pytest.fixture
def fixture_kernel(fake_kernel, monkeypatch):
    """context() reads the node's kernel: a fixture's, never the machine's (issue 43)."""
    fake_kernel.activate(monkeypatch)


@pytest.mark.usefixtures("fixture_kernel")
def test_download_retries_and_timeout_reach_the_policy_through_settings(tmp_path):
    fields = retry_env({"DOWNLOAD_RETRIES": "2", "DOWNLOAD_TIMEOUT": "45.5"})
    settings = validate(Settings(install_dir=tmp_path, **fields))
    p = context(settings, strict=False).http.retry_policy
    assert (p.attempts, p.total_timeout) == (2, 45.5)
    assert p.read_timeout == NETWORK_DEFAULTS.read_timeout
    assert retry_env({}) == {}
    assert with_settings(NETWORK_DEFAULTS, None, None) == NETWORK_DEFAULTS


@pytest.mark.parametrize(
    "env",
    [
        {"DOWNLOAD_RETRIES": "0"},
        {"DOWNLOAD_RETRIES": "x"},
        {"DOWNLOAD_TIMEOUT": "-1"},
        {"DOWNLOAD_TIMEOUT": "soon"},
    ],
)
def test_bad_download_retries_or_timeout_are_usage_errors(env):
    with pytest.raises(UsageError) as info:
        retry_env(env)
    assert next(iter(env)) in info.value.message


def test_network_defaults_are_sane():
    p = NETWORK_DEFAULTS
    assert p.attempts >= 3 and 0 < p.wait_initial <= p.wait_max <= 60
    assert p.total_timeout >= 300 and p.connect_timeout <= p.read_timeout
    with pytest.raises(ValueError):
        RetryPolicy(0, 1, 1, 1, 1, 1)


def test_download_without_policy_uses_the_sessions(server, session, tmp_path, waits, monkeypatch):
    server.expect_request("/f").respond_with_data("", status=500)
    monkeypatch.setenv("DOWNLOAD_RETRIES", "5")  # read by the CLI only, never here
    session.retry_policy = with_settings(NETWORK_DEFAULTS, 2, None)  # as make_session(policy=)
    with pytest.raises(DownloadError, match=r"\(2 attempts"):
        download(session, server.url_for("/f"), tmp_path / "f")
    assert len(server.log) == 2 and len(waits) == 1
    assert 0.5 <= waits[0] <= 1.0  # NETWORK_DEFAULTS' first backoff step (1 s, equal jitter)


# --------------------------------------------------------------------------- a typo'd host


TYPO_URL = "https://us.download.nvidia.co/XFree86/Linux-x86_64/580.82.07/NVIDIA-Linux-x86_64-580.82.07.run"


def test_a_host_that_does_not_resolve_is_named_with_what_to_check(session, tmp_path, waits,
                                                                   monkeypatch):
    """Issue 41 §4: urllib3's text ("... Failed to resolve 'us.download.nvidia.co' ([Errno -2]
    Name or ser...") was cut mid-word and stored in status.json, and the hint never said to
    check the URL. The lookup fails the way glibc's getaddrinfo does (EAI_NONAME, -2), through
    the real requests/urllib3 stack; no packet leaves the machine."""
    import socket

    def no_such_name(host, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    with pytest.raises(DownloadError) as info:
        download(session, TYPO_URL, tmp_path / "f", policy=RetryPolicy(2, 0.01, 0.01, 100, 1, 1))
    err = info.value
    assert "cannot resolve host 'us.download.nvidia.co'" in err.message, err.message
    assert "check the URL" in err.hint and "'us.download.nvidia.co'" in err.hint
    assert "\n" not in err.message and "..." not in err.message and len(err.message) < 300
    assert "HTTPSConnection" not in err.message  # urllib3's object repr is not the operator's
    # status.json stores exc.message and exc.hint as they are (install.py's _record).


@pytest.mark.parametrize("text", ["Failed to resolve " * 30, "x" * 400, "a, b " * 100])
def test_a_long_cause_is_cut_between_words(text):
    text = " ".join(text.split())
    cut = retry.cut_at_word(text)
    assert len(cut) <= retry.CAUSE_MAX_CHARS and cut.endswith(" ...")
    kept = cut[:-4]
    assert text.startswith(kept)
    assert " " not in text or text[len(kept)] in " ,"  # what follows the kept text is a boundary
