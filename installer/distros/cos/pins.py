"""SHA-256 pins for what we download and run as root.

The NVIDIA ``.run`` is pinned with ``--driver-sha256``. COS artifacts (kernel
headers, toolchain, prebuilt modules, the custom ``.run``, signatures) are
pinned with a manifest, ``--cos-artifacts-sha256 FILE|URL``: ``sha256sum``
output (``<hex>  <name>`` per line, ``*`` binary marker allowed), made when a
build is first vetted. An artifact is found by its path under the build's
artifacts URL (``extensions/gpu/…``) or by its file name.

With a manifest, every file the plan reads must be listed, or the run stops
with exit 6 before any download: the version aliases (``gpu_*_version``),
``toolchain_env``, ``toolchain_url``, the toolchain archive, the kernel headers,
the NVIDIA ``.run`` (unless ``--driver-sha256`` pins it), prebuilt modules, the
custom ``.run`` and its signatures. Metadata the build does not publish (a
``toolchain_url`` most builds lack) needs no line: it is probed, not read, and
an unlisted one that exists is refused. A listed one must exist and match.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import structlog

from installer.base.dataclass import dataclass
from installer.base.errors import IntegrityError, UsageError
from installer.base.fsutil import UnreadableFile, read_limited
from installer.base.values import sha256_digest
from installer.net.policy import file_name, redact_url

log = structlog.get_logger(__name__)

MAX_MANIFEST_BYTES = 1 << 20
_LINE = re.compile(r"^(\S+) [ *](.+)$")  # sha256sum: "<digest>  <name>" or "<digest> *<name>"


@dataclass(frozen=True)
class Manifest:
    source: str  # where it came from (redacted), for messages
    digests: dict[str, str]  # name (as listed) -> sha256

    @classmethod
    def parse(cls, text: str, source: str) -> Manifest:
        digests: dict[str, str] = {}
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            m = _LINE.match(line)
            digest = sha256_digest(m.group(1)) if m else None
            if m is None or digest is None:
                raise UsageError(
                    f"line {n} of the COS artifacts manifest {source} is not "
                    "'<sha256>  <name>'",
                    hint="make it with sha256sum (one artifact per line)", path=source)
            digests[m.group(2).strip().removeprefix("./")] = digest
        if not digests:
            raise UsageError(f"the COS artifacts manifest {source} lists no artifact",
                             path=source)
        return cls(source, digests)

    def lookup(self, name: str) -> str | None:
        """The digest of artifact ``name`` (a path under the build, or a URL's file name)."""
        if name in self.digests:
            return self.digests[name]
        base = name.rsplit("/", 1)[-1]
        found = {d for listed, d in self.digests.items() if listed.rsplit("/", 1)[-1] == base}
        return found.pop() if len(found) == 1 else None

    def require(self, url: str, label: str) -> str:
        """The digest pinning ``url``; IntegrityError (exit 6) when the manifest has none."""
        name = file_name(url, "")
        digest = self.lookup(name)
        if digest is None:
            raise IntegrityError(
                f"the {label} {redact_url(url)} is not pinned by the COS artifacts manifest "
                f"{self.source} (no entry for {name!r}); not downloading it",
                hint="add its sha256 to the manifest once the artifact is vetted, or pick the "
                "driver version the manifest was made for",
                url=redact_url(url))
        return digest

    def not_listed(self, url: str, label: str) -> IntegrityError:
        name = file_name(url, "")
        return IntegrityError(
            f"the {label} {redact_url(url)} is not pinned by the COS artifacts manifest "
            f"{self.source} (no entry for {name!r}); not reading it",
            hint="add its sha256 to the manifest once the file is vetted (a manifest made "
            "with sha256sum over the whole build lists it)", url=redact_url(url))

    def check_text(self, name: str, text: str | None, url: str) -> None:
        """A metadata file read from the build: the manifest lists it (callers read only
        what it lists), so it must exist and match."""
        digest = self.lookup(name)
        if digest is None:
            raise self.not_listed(url, name)
        if text is None:
            raise IntegrityError(
                f"{redact_url(url)} is pinned by the COS artifacts manifest {self.source} "
                "but the build does not publish it",
                hint="the artifacts URL serves another build, or the mirror is incomplete",
                url=redact_url(url))
        actual = hashlib.sha256(text.encode()).hexdigest()
        if actual != digest:
            raise IntegrityError(
                f"sha256 mismatch for {redact_url(url)}: the COS artifacts manifest "
                f"{self.source} says {digest}, got {actual}",
                hint="the build's metadata changed since the manifest was made: check the "
                "mirror", url=redact_url(url), expected_sha256=digest, actual_sha256=actual)


def load(location: str, fetch_url: Callable[[str], str | None]) -> Manifest:
    """The manifest at a container path or a URL (``fetch_url(url) -> text | None``)."""
    if urlsplit(location).scheme:
        shown = redact_url(location)
        text = fetch_url(location)
        if text is None:
            raise UsageError(f"the COS artifacts manifest {shown} does not exist (HTTP 404)",
                             hint="check --cos-artifacts-sha256 (COS_ARTIFACTS_SHA256)", url=shown)
        return Manifest.parse(text, shown)
    try:
        data = read_limited(Path(location), MAX_MANIFEST_BYTES)
    except (OSError, UnreadableFile) as exc:
        why = exc.reason if isinstance(exc, UnreadableFile) else (exc.strerror or str(exc))
        raise UsageError(f"cannot read the COS artifacts manifest {location}: {why}",
                         hint="check --cos-artifacts-sha256 (COS_ARTIFACTS_SHA256)",
                         path=location) from None
    return Manifest.parse(data.decode(errors="replace"), location)
