"""installer.net.session: the trust store a session uses."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from installer.base.errors import DownloadError
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


# --------------------------------------------------------------------------- one session type


def test_the_session_declares_its_policies_and_serves_file_urls_itself(tmp_path):
    """The policies are the session's own typed attributes (not bolted on and read back
    with getattr), and file:// is its adapter's, so no fetch path tells local from
    remote by hand."""
    import ast
    import inspect

    from installer.net import fetch, transfer
    from installer.net.policy import UrlPolicy
    from installer.net.retry import NETWORK_DEFAULTS, TransferLimits
    from installer.net.session import ArtifactSession, LocalFSAdapter

    assert set(ArtifactSession.__annotations__) >= {"transfer_limits", "retry_policy", "url_policy"}
    allowed = UrlPolicy(allow_insecure_http=True)
    s = make_session(url_policy=allowed)
    assert s.url_policy is allowed and s.retry_policy is NETWORK_DEFAULTS
    assert s.transfer_limits == TransferLimits()
    assert isinstance(s.get_adapter((tmp_path / "x").as_uri()), LocalFSAdapter)
    for module in (fetch, transfer):
        names = {n.id for n in ast.walk(ast.parse(inspect.getsource(module)))
                 if isinstance(n, ast.Name)}
        assert not names & {"local_file", "local_path"}, module.__name__


def test_a_local_file_answers_like_a_server(tmp_path):
    """GET: 200 with its length and body; a missing path: 404; HEAD of a directory: 404
    (what Path.is_file says); a directory read: refused, naming it."""
    (tmp_path / "f").write_bytes(b"abc")
    s = make_session()
    got = s.get((tmp_path / "f").as_uri(), stream=True)
    assert (got.status_code, got.headers["Content-Length"], got.raw.read()) == (200, "3", b"abc")
    got.close()
    assert s.get((tmp_path / "absent").as_uri()).status_code == 404
    assert s.head(tmp_path.as_uri()).status_code == 404
    assert s.head((tmp_path / "f").as_uri()).status_code == 200
    with pytest.raises(DownloadError, match=f"cannot read {tmp_path}: Is a directory"):
        s.get(tmp_path.as_uri())
