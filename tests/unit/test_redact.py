"""installer.redact: secrets in URLs never reach output."""

from __future__ import annotations

import json

from structlog.testing import capture_logs

from installer import redact
from installer.log import configure

URL = "https://bot:Pa55word@h.example/a.run?X-Goog-Signature=abcdef123&X-Goog-Credential=cred9"


def test_urls_anywhere_in_any_structure_are_redacted():
    doc = redact.scrub({"url": URL, "steps": [{"detail": f"fetch {URL} now"}],
                        "n": 3, "ok": True, "none": None})
    text = json.dumps(doc)
    for secret in ("Pa55word", "abcdef123", "cred9"):
        assert secret not in text
    assert doc["url"] == "https://***@h.example/a.run?X-Goog-Signature=***&X-Goog-Credential=***"
    assert doc["n"] == 3 and doc["ok"] is True and doc["none"] is None


def test_registered_secrets_are_removed_even_without_their_url():
    redact.register_url(URL)
    assert redact.scrub_text("bad signature abcdef123 for user bot") == \
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
