"""pytest fixtures for the download-layer tests: a real HTTPS server on 127.0.0.1 with a
private CA (pytest-httpserver + trustme) and a session that trusts only that CA.

Import the fixtures into a test module: ``from tests.https_fixtures import *  # noqa``.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trustme
from pytest_httpserver import HTTPServer

from installer.net import retry
from installer.net.session import make_session

__all__ = ["ca", "ca_bundle", "https_server", "server", "clean_env", "session", "waits"]

# What could point requests elsewhere than the test's CA and server, or change the policy.
ENV_TO_CLEAR = (
    "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR",
    "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy",
    "DOWNLOAD_RETRIES", "DOWNLOAD_TIMEOUT",
)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def ca_bundle(ca, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture(scope="module")
def https_server(ca):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(ctx)
    server = HTTPServer(host="127.0.0.1", port=0, ssl_context=ctx, threaded=True)
    server.start()
    yield server
    server.clear()
    server.stop()


@pytest.fixture
def server(https_server):
    https_server.clear()
    yield https_server
    https_server.clear()


@pytest.fixture
def clean_env(monkeypatch):
    for var in ENV_TO_CLEAR:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def session(clean_env, ca_bundle):
    s = make_session()
    s.verify = str(ca_bundle)
    yield s
    s.close()


@pytest.fixture
def waits(monkeypatch):
    """Record the waits the retryer asks for instead of sleeping them."""
    recorded: list[float] = []
    monkeypatch.setattr(retry, "sleep", recorded.append)
    return recorded
