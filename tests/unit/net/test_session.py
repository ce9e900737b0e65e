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


def _netrc(monkeypatch, tmp_path):
    (tmp_path / ".netrc").write_text("default login hostuser password HostS3cret\n")
    monkeypatch.setenv("HOME", str(tmp_path))  # the pod's HOME=/root is the host's root


def test_the_hosts_netrc_is_never_used(server, session, monkeypatch, tmp_path):
    """Issue 22 item 7: requests' trust_env would send ~/.netrc's credentials."""
    import requests

    _netrc(monkeypatch, tmp_path)
    assert requests.utils.get_netrc_auth("https://a.example/x")  # requests would use it
    server.expect_request("/f").respond_with_data(b"x")
    resp = session.get(server.url_for("/f"))
    assert resp.status_code == 200 and "Authorization" not in resp.request.headers
    monkeypatch.setenv("NETRC", str(tmp_path / ".netrc"))
    assert "Authorization" not in session.prepare_request(
        requests.Request("GET", "https://a.example/x")).headers


def test_credentials_in_the_url_and_the_environments_proxy_and_ca_still_apply(
        clean_env, monkeypatch, tmp_path):
    import requests

    _netrc(monkeypatch, tmp_path)
    s = make_session()
    got = s.prepare_request(requests.Request("GET", "https://op:pw@a.example/x"))
    assert got.headers["Authorization"] == requests.auth._basic_auth_str("op", "pw")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ca.pem")
    merged = s.merge_environment_settings("https://a.example/x", {}, None, None, None)
    assert merged["proxies"]["https"] == "http://proxy.example:3128"
    assert merged["verify"] == "/etc/ca.pem"
    assert s.merge_environment_settings("https://127.0.0.1/x", {}, None, None, None)[
        "proxies"].get("https") is None  # NO_PROXY


def test_a_redirect_to_another_host_drops_credentials_and_adds_none(clean_env, monkeypatch,
                                                                   tmp_path):
    import requests

    _netrc(monkeypatch, tmp_path)
    s = make_session()
    first = s.prepare_request(requests.Request("GET", "https://op:pw@a.example/x"))
    resp = requests.Response()
    resp.request = first
    nxt = first.copy()
    nxt.prepare_url("https://b.example/y", None)
    s.rebuild_auth(nxt, resp)
    assert "Authorization" not in nxt.headers
    same = first.copy()
    same.prepare_url("https://a.example/z", None)
    s.rebuild_auth(same, resp)
    assert "Authorization" in same.headers
