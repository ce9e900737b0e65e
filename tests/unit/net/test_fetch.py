"""installer.net.fetch: small documents and existence probes, with the download's rules."""

from __future__ import annotations

import json
import os
import socket

import pytest
from structlog.testing import capture_logs
from werkzeug import Response

from installer.base.errors import DownloadError, UsageError
from installer.net.fetch import fetch_text, url_exists
from installer.net.retry import RetryPolicy
from installer.net.session import make_session
from installer.net.transfer import download
from tests.unit.net.kit import FAST, seen


def test_fetch_text(server, session, tmp_path, no_sleep):
    server.expect_request("/gpu_default_version").respond_with_data("535.183.01\n")
    answers = iter([503])
    server.expect_request("/flaky").respond_with_handler(lambda r: Response("x", status=next(answers, 200)))
    server.expect_request("/huge").respond_with_data("9" * 5000)
    server.expect_request("/forbidden").respond_with_data("", status=403)
    server.expect_request("/gpu_nope_version").respond_with_data("Not Found", status=404)

    assert fetch_text(session, server.url_for("/gpu_default_version"), policy=FAST) == "535.183.01\n"
    assert fetch_text(session, server.url_for("/gpu_nope_version"), policy=FAST) is None
    assert fetch_text(session, server.url_for("/flaky"), policy=FAST) == "x"
    assert len(no_sleep) == 1
    with pytest.raises(DownloadError, match="larger than 1000 bytes"):
        fetch_text(session, server.url_for("/huge"), policy=FAST, max_bytes=1000)
    with pytest.raises(DownloadError, match="403"):
        fetch_text(session, server.url_for("/forbidden"), policy=FAST)
    local = tmp_path / "v"
    local.write_text("R535\n")
    assert fetch_text(session, local.as_uri()) == "R535\n"
    assert fetch_text(session, (tmp_path / "absent").as_uri()) is None
    with pytest.raises(UsageError):
        fetch_text(session, "http://127.0.0.1/x")


def test_fetch_text_refuses_encoded_bodies_too(server, session):
    server.expect_request("/meta").respond_with_data(b"x", headers={"Content-Encoding": "br"})
    with pytest.raises(DownloadError, match="'br'-encoded"):
        fetch_text(session, server.url_for("/meta"), policy=FAST)


def test_a_fifo_behind_a_file_url_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(DownloadError, match="is a FIFO"):
        fetch_text(None, f"file://{tmp_path}/fifo")


# --------------------------------------------------------------------------- url_exists


def test_url_exists_over_https(artifact_server, monkeypatch):
    from installer.net.session import make_session

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", artifact_server.ca_bundle_path)
    artifact_server.serve("/b/nvidia-drivers-1.2.3.tgz", b"data")
    artifact_server.fault("/b/flaky", statuses=[503, 200])
    artifact_server.serve("/b/flaky", b"data")
    session = make_session()
    quick = RetryPolicy(attempts=3, wait_initial=0.0, wait_max=0.0, total_timeout=30,
                        connect_timeout=5, read_timeout=5)
    assert url_exists(session, artifact_server.url_for("/b/nvidia-drivers-1.2.3.tgz"), policy=quick)
    assert not url_exists(session, artifact_server.url_for("/b/missing.tgz"), policy=quick)
    assert url_exists(session, artifact_server.url_for("/b/flaky"), policy=quick)
    # Probes never download the body.
    assert {r.method for r in artifact_server.requests} == {"HEAD"}
    assert all(r.body_bytes == 0 for r in artifact_server.requests)


def test_url_exists_falls_back_to_a_one_byte_get_when_head_is_not_allowed(server, session):
    server.expect_request("/obj", method="HEAD").respond_with_data("", status=405)
    server.expect_request("/obj", method="GET").respond_with_data("x", status=206)
    assert url_exists(session, server.url_for("/obj"), policy=FAST)
    assert [(r.method, r.headers.get("Range")) for r in seen(server)] == [
        ("HEAD", None), ("GET", "bytes=0-0")]


def test_url_exists_reads_answers_as_a_download_does(server, session, no_sleep):
    server.expect_request("/forbidden").respond_with_data("", status=403)
    server.expect_request("/teapot").respond_with_data("", status=418)
    assert not url_exists(session, server.url_for("/forbidden"),
                          policy=FAST)
    with pytest.raises(DownloadError, match="HTTP 418") as info:
        url_exists(session, server.url_for("/teapot"), policy=FAST)
    assert info.value.context["status"] == 418
    with pytest.raises(UsageError, match="plain http"):
        url_exists(session, "http://127.0.0.1:9/x")


def test_url_exists_scrubs_secrets_from_its_errors(clean_env, no_sleep):
    # Nothing listens here: urllib3's message repeats the path and query, which before
    # net.fetch reached the error unscrubbed.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"https://127.0.0.1:{port}/o?X-Goog-Signature=topsecretvalue"
    with capture_logs() as logs, pytest.raises(DownloadError) as info:
        url_exists(make_session(), url,
                   policy=RetryPolicy(2, 0, 0, 10, 1, 1))
    text = str(info.value) + json.dumps([{k: str(v) for k, v in e.items()} for e in logs])
    assert "topsecretvalue" not in text
    assert "ConnectionError" in str(info.value)


@pytest.mark.parametrize("form", ["file://{p}", "file://localhost{p}", "FILE://{p}"])
def test_file_urls_mean_the_same_file_to_fetch_probe_and_download(tmp_path, form):
    doc = tmp_path / "dir with space" / "gpu_default_version"
    doc.parent.mkdir()
    doc.write_text("535.183.01\n")
    url = form.format(p=str(doc).replace(" ", "%20"))
    assert fetch_text(None, url) == "535.183.01\n"
    assert url_exists(None, url)
    assert download(None, url, tmp_path / "copy").path.read_text() == "535.183.01\n"
    absent = url.replace("gpu_default_version", "absent")
    assert fetch_text(None, absent) is None
    assert not url_exists(None, absent)
    with pytest.raises(DownloadError, match="does not exist"):
        download(None, absent, tmp_path / "copy2")


def test_file_urls_naming_another_host_are_refused_by_all(tmp_path):
    url = "file://otherhost/etc/passwd"
    for call in (lambda: fetch_text(None, url),
                 lambda: url_exists(None, url),
                 lambda: download(None, url, tmp_path / "x")):
        with pytest.raises(UsageError, match="names host"):
            call()
