"""installer.net.session: the trust store a session uses."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from installer.errors import DownloadError
from installer.net.session import make_session
from installer.net.transfer import download
from tests.unit.net.kit import FAST, PAYLOAD_SHA, ranged


def test_make_session_honours_ssl_cert_file(server, clean_env, ca_bundle, monkeypatch, tmp_path):
    server.expect_request("/f").respond_with_handler(ranged)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_bundle))
    got = download(make_session(), server.url_for("/f"), tmp_path / "f", policy=FAST)
    assert got.sha256 == PAYLOAD_SHA


def test_make_session_honours_requests_ca_bundle(server, clean_env, ca_bundle, monkeypatch, tmp_path):
    server.expect_request("/f").respond_with_handler(ranged)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca_bundle))
    got = download(make_session(), server.url_for("/f"), tmp_path / "f", policy=FAST)
    assert got.sha256 == PAYLOAD_SHA


def test_untrusted_certificate_fails_without_retry(server, clean_env, tmp_path, no_sleep):
    server.expect_request("/f").respond_with_handler(ranged)
    with capture_logs() as logs, pytest.raises(DownloadError) as info:
        download(make_session(), server.url_for("/f"), tmp_path / "f", policy=FAST)
    assert "REQUESTS_CA_BUNDLE" in info.value.hint
    assert no_sleep == [] and not [e for e in logs if e["event"] == "download_retry"]
    assert list(tmp_path.iterdir()) == []
