"""What an NVIDIA driver version looks like: ``<major>.<minor>[.<patch>]``.

Three-part versions for current branches (NVIDIA/open-gpu-kernel-modules' README:
"version 575.64.05"), two parts for old ones (390.157). ASCII digits only, matched
whole: a value that passes becomes part of URLs, file names and paths.
"""

from __future__ import annotations

import re

DRIVER_VERSION = re.compile(r"[0-9]{2,4}\.[0-9]{1,4}(?:\.[0-9]{1,4})?")


def is_driver_version(text: str) -> bool:
    return DRIVER_VERSION.fullmatch(text) is not None

# The oldest nvidia-installer whose options we drive (nvidia_options.FIRST_RELEASE:
# --no-systemd appeared in 465.19.01). One rule for `install` and `manifests render`.
OLDEST_SUPPORTED = "465.19.01"


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def unsupported_reason(version: str) -> str | None:
    """Why this installer refuses explicit driver ``version``, or None if it takes it."""
    if not is_driver_version(version):
        return f"{version!r} is not a driver version (e.g. 550.127.05)"
    if version_key(version) < version_key(OLDEST_SUPPORTED):
        return (f"driver {version} is older than this installer supports "
                f"({OLDEST_SUPPORTED}, R470 or newer)")
    return None
