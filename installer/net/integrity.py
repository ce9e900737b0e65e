"""The one reading of a sha256 pin (``--driver-sha256``, a download's expected digest).

One rule everywhere: 64 hex digits in either case, optionally written ``sha256:<hex>``
as in OCI digests and many checksum files; the prefix is dropped and the digits
lower-cased, so pins compare equal however they were written. Anything else is a
usage error (exit 2) before any download.
"""

from __future__ import annotations

import re

from installer.errors import UsageError

PREFIX = "sha256:"
_HEX64 = re.compile(r"[0-9a-f]{64}")


def normalize_sha256(value: str | None, what: str = "expected sha256") -> str | None:
    """``value`` as 64 lower-case hex digits (None stays None); UsageError naming ``what``."""
    if value is None:
        return None
    digest = value.strip().lower().removeprefix(PREFIX)
    if not _HEX64.fullmatch(digest):
        raise UsageError(
            f"{what} {value!r} is not 64 hex digits (optionally prefixed {PREFIX!r})",
            hint="pass the hex SHA-256 of the file (sha256sum output, first column)",
        )
    return digest
