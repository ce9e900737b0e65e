"""Small fetches: a metadata document (:func:`fetch_text`) and an existence probe
(:func:`url_exists`), with the same URL policy, ``file://`` reading, redaction, response
reading and retries as a download."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from installer.base.errors import DownloadError
from installer.net import retry
from installer.net.pace import Pacer
from installer.net.policy import redact_url, scrubber
from installer.net.retry import RetryPolicy

if TYPE_CHECKING:
    from installer.net.session import ArtifactSession

log = structlog.get_logger(__name__)


def fetch_text(
    session: ArtifactSession | None,
    url: str,
    *,
    policy: RetryPolicy | None = None,
    max_bytes: int = 1 << 20,
) -> str | None:
    """A small text document (e.g. a COS ``gpu_default_version`` file), or None on 404.

    A missing ``file://`` path is None too (the session's file adapter answers 404).
    Larger than ``max_bytes``, not UTF-8, or any other failure: :class:`DownloadError`.
    """
    # Deferred to the first request: the session module imports requests, which a run that
    # fetches nothing (a cache hit, every boot) must not load (installer/net/__init__.py).
    from installer.net.session import classify, or_default, refuse_encoding, request_errors

    session = or_default(session)
    url_policy = session.url_policy
    url_policy.check(url)
    shown = redact_url(url)
    policy = policy or session.retry_policy
    scrub = scrubber(url)
    # The same bounds as a download: a trickled metadata file must not stall the plan.
    pace = Pacer(session.transfer_limits, shown)

    def attempt() -> bytes | None:
        pace.begin_attempt()
        resp = session.get(url, stream=True, timeout=pace.timeout(policy),
                           headers={"Accept-Encoding": "identity"})
        with resp:
            if not classify(resp, shown, url_policy, missing=(404,)):
                return None
            refuse_encoding(resp, shown)
            buf = bytearray()
            for chunk in resp.raw.stream(64 * 1024, decode_content=False):
                buf += chunk
                pace.pace(len(chunk))
                if len(buf) > max_bytes:
                    break
            return bytes(buf)

    with request_errors(shown, scrub):
        data = retry.network_retryer(policy, url=shown, redact=scrub,
                                     deadline_at=pace.deadline_at)(attempt)
    if data is None:
        log.info("fetch_text_missing", url=shown, status=404)
        return None
    return _decode_text(data, max_bytes, shown)


def _decode_text(data: bytes, max_bytes: int, shown: str) -> str:
    if len(data) > max_bytes:
        raise DownloadError(
            f"{shown} is larger than {max_bytes} bytes; expected a small text file", url=shown
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DownloadError(f"{shown} is not UTF-8 text", url=shown) from exc


def url_exists(session: ArtifactSession | None, url: str, *,
               policy: RetryPolicy | None = None) -> bool:
    """Whether ``url`` names an object, without fetching it (HEAD; a 1-byte GET if HEAD is
    not allowed). 404/403/410 -> False; transient errors are retried; others raise."""
    # Deferred to the first request (see fetch_text).
    from installer.net.session import classify, or_default, request_errors

    session = or_default(session)
    url_policy = session.url_policy
    url_policy.check(url)
    shown = redact_url(url)
    policy = policy or session.retry_policy
    scrub = scrubber(url)

    def attempt() -> bool:
        resp = session.head(url, timeout=policy.timeout, allow_redirects=True)
        if resp.status_code in (405, 501):
            resp = session.get(url, headers={"Range": "bytes=0-0", "Accept-Encoding": "identity"},
                               timeout=policy.timeout, stream=True)
            resp.close()
        # GCS answers 403 for a missing object in a bucket one cannot list.
        return classify(resp, shown, url_policy, expected=(200, 206), missing=(403, 404, 410))

    with request_errors(shown, scrub, doing="probing"):
        found = retry.network_retryer(policy, url=shown, redact=scrub)(attempt)
    log.info("artifact_probe", url=shown, exists=found)
    return found
