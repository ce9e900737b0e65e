"""The one reading of a sha256 pin given by a user (``--driver-sha256``, a download's
expected digest): ``values.sha256_digest``, anything else a usage error (exit 2) before
any download."""

from __future__ import annotations

from installer.base.errors import UsageError
from installer.base.values import SHA256_PREFIX, sha256_digest


def normalize_sha256(value: str | None, what: str = "expected sha256") -> str | None:
    """``value`` as 64 lower-case hex digits (None stays None); UsageError naming ``what``."""
    if value is None:
        return None
    digest = sha256_digest(value)
    if digest is None:
        raise UsageError(
            f"{what} {value!r} is not 64 hex digits (optionally prefixed {SHA256_PREFIX!r})",
            hint="pass the hex SHA-256 of the file (sha256sum output, first column)",
        )
    return digest
