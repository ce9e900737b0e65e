"""installer.net.policy: which URLs are fetched, how they are shown, the file names they
give; secrets in URLs never reach output."""

from __future__ import annotations

import json

import pytest
from pytest_httpserver import HTTPServer
from structlog.testing import capture_logs

from installer.base.errors import UsageError
from installer.log import configure
from installer.net import policy
from installer.net.policy import UrlPolicy, check_url_scheme
from installer.net.session import make_session
from installer.net.transfer import download
from installer.steps import staging
from tests.unit.net.kit import FAST, PAYLOAD_SHA, ranged

# --------------------------------------------------------------------------- schemes


def test_http_refused_unless_allowed(clean_env, tmp_path):
    plain = HTTPServer(host="127.0.0.1", port=0)
    plain.start()
    try:
        plain.expect_request("/f").respond_with_handler(ranged)
        url = plain.url_for("/f")
        assert url.startswith("http://")

        with pytest.raises(UsageError) as info:
            check_url_scheme(url, allow_insecure_http=False)
        assert url in info.value.message and "--allow-insecure-http" in info.value.message

        s = make_session()
        with pytest.raises(UsageError):
            download(s, url, tmp_path / "f", policy=FAST)
        assert plain.log == []  # refused before any request

        allowed = make_session(url_policy=UrlPolicy(allow_insecure_http=True))
        got = download(allowed, url, tmp_path / "f", policy=FAST)
        assert got.sha256 == PAYLOAD_SHA and len(plain.log) == 1
    finally:
        plain.stop()


@pytest.mark.parametrize(
    "url", ["ftp://example.com/x", "gs://bucket/obj", "example.com/x", "https:///nohost"]
)
def test_other_schemes_are_usage_errors(url):
    with pytest.raises(UsageError) as info:
        check_url_scheme(url, allow_insecure_http=True)
    assert info.value.exit_code == 2
    if url.startswith("gs://"):
        assert "storage.googleapis.com" in info.value.hint


def test_https_and_file_schemes_accepted():
    check_url_scheme("https://example.com/a.run", allow_insecure_http=False)
    check_url_scheme("file:///srv/a.run", allow_insecure_http=False)
    check_url_scheme("HTTPS://example.com/a.run", allow_insecure_http=False)


def test_redact_url():
    assert policy.redact_url("https://u:p@h:8443/a/b?sig=abc&x=1#frag") == "https://***@h:8443/a/b?sig=***&x=***"
    assert policy.redact_url("https://h/a") == "https://h/a"
    assert policy.redact_url("file:///x/y") == "file:///x/y"


# --------------------------------------------------------------------------- redaction

URL = "https://bot:Pa55word@h.example/a.run?X-Goog-Signature=abcdef123&X-Goog-Credential=cred9"


def test_urls_anywhere_in_any_structure_are_redacted():
    doc = policy.scrub({"url": URL, "steps": [{"detail": f"fetch {URL} now"}],
                        "n": 3, "ok": True, "none": None})
    text = json.dumps(doc)
    for secret in ("Pa55word", "abcdef123", "cred9"):
        assert secret not in text
    assert doc["url"] == "https://***@h.example/a.run?X-Goog-Signature=***&X-Goog-Credential=***"
    assert doc["n"] == 3 and doc["ok"] is True and doc["none"] is None


def test_registered_secrets_are_removed_even_without_their_url():
    policy.register_url(URL)
    assert policy.scrub_text("bad signature abcdef123 for user bot") == \
        "bad signature *** for user bot"


def test_every_log_event_is_redacted(capsys):
    configure("json")
    import structlog

    structlog.get_logger("t").error("install_failed", error=f"HTTP 404 for {URL}", url=URL)
    line = capsys.readouterr().err
    assert "Pa55word" not in line and "abcdef123" not in line
    assert json.loads(line)["url"].startswith("https://***@h.example/a.run?")


def test_capture_logs_still_sees_events():
    with capture_logs() as logs:
        import structlog

        structlog.get_logger("t").info("x", url=URL)
    assert logs[0]["event"] == "x"


# --------------------------------------------------------------------------- file names


@pytest.mark.parametrize(("url", "name"), [
    ("https://h/XFree86/Linux-x86_64/550.127.05/NVIDIA-Linux-x86_64-550.127.05.run",
     "NVIDIA-Linux-x86_64-550.127.05.run"),
    ("https://h/d/NVIDIA.run?X-Goog-Signature=secret#frag", "NVIDIA.run"),  # no query in names
    ("https://h/d/NVIDIA%20v2.run", "NVIDIA v2.run"),
    ("https://h/d/..%2F..%2Fetc%2Fcron.d%2Fx", "x"),  # a decoded separator splits too
    ("file:///srv/drivers/NVIDIA.run/", "NVIDIA.run"),
    ("https://h/d/..", "fallback"),
    ("https://h/d/%2e%2e", "fallback"),
    ("https://h/d/.", "fallback"),
    ("https://h/", "fallback"),
    ("https://h/d/a%00b.run", "fallback"),
])
def test_file_name_never_leaves_the_download_dir(url, name):
    assert policy.file_name(url, "fallback") == name


def test_the_ubuntu_driver_download_is_named_by_the_same_rule(tmp_path):
    """staging.download_driver (the Ubuntu path) once took the raw last URL segment: a
    ``..`` there or a signed URL's query ended up in the file name."""
    from types import SimpleNamespace

    from installer.host.installdir import Tree
    from installer.records.results import Results, Staged

    def staged_in(root):
        results = Results()
        results.add("prepare_staging", Staged(Tree(root)))
        return results

    src = tmp_path / "src" / "NVIDIA-Linux-x86_64-550.127.05.run"
    src.parent.mkdir()
    src.write_bytes(b"#!/bin/sh\n")
    ctx = SimpleNamespace(results=staged_in(tmp_path / "staging"), http=None,
                          settings=SimpleNamespace())
    got = staging.download_driver(src.as_uri() + "?sig=secretvalue", None).run(ctx)
    assert got.files["driver"].path == tmp_path / "staging/downloads" / src.name
    ctx.results = staged_in(tmp_path / "staging2")
    (src.parent / "sub").mkdir()
    got = staging.download_driver(src.parent.as_uri() + "/sub/..%2F" + src.name, None).run(ctx)
    assert got.files["driver"].path == tmp_path / "staging2/downloads" / src.name
    assert policy.file_name(src.parent.as_uri() + "/..", "driver.run") == "driver.run"


def test_allow_insecure_http_is_read_in_one_place():
    """Issue 32 item 5: the flag is read once (detect.context builds the UrlPolicy the run's
    HTTP session carries), not passed by hand through every download."""
    from pathlib import Path

    import installer

    root = Path(installer.__file__).parent
    reads = {str(p.relative_to(root)): p.read_text().count("settings.allow_insecure_http")
             for p in root.rglob("*.py")}
    assert {k: v for k, v in reads.items() if v} == {"detect.py": 1}
