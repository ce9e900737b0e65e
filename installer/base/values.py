"""The values every caller parses the same way: NVIDIA driver versions, kernel releases and
sha256 digests. Pure and ASCII-only, matched whole: a value that passes becomes part of
URLs, file names and paths."""

from __future__ import annotations

import re

# ``<major>.<minor>[.<patch>]``: three parts for current branches (NVIDIA/open-gpu-kernel-modules'
# README: "version 575.64.05"), two for old ones (390.157).
DRIVER_VERSION = re.compile(r"[0-9]{2,4}\.[0-9]{1,4}(?:\.[0-9]{1,4})?")

# ``uname -r``: 5.15.0-1049-gke, 6.1.0-56-cloud-amd64, 6.6.68+, 4.19.0~rc1. At most 64
# characters: the kernel keeps it in ``char release[__NEW_UTS_LEN + 1]`` with
# ``#define __NEW_UTS_LEN 64`` (torvalds/linux include/uapi/linux/utsname.h). It names
# paths (/lib/modules/<r>, bundle names, the cache key): no '/', no '..', no leading
# '-' or '.'.
KERNEL_RELEASE_MAX = 64
_KERNEL_RELEASE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._+~-]{{0,{KERNEL_RELEASE_MAX - 1}}}")

# A sha256 pin: 64 hex digits in either case, optionally written ``sha256:<hex>`` as in
# OCI digests and many checksum files.
SHA256_PREFIX = "sha256:"
_HEX64 = re.compile(r"[0-9a-f]{64}")


def is_driver_version(text: str) -> bool:
    return DRIVER_VERSION.fullmatch(text) is not None


def is_kernel_release(text: str) -> bool:
    return _KERNEL_RELEASE.fullmatch(text) is not None and ".." not in text


def sha256_digest(text: str) -> str | None:
    """``text`` as 64 lower-case hex digits (prefix dropped, case folded), or None when it
    is not a sha256 digest. Callers raise their own error (usage, bundle, integrity)."""
    digest = text.strip().lower().removeprefix(SHA256_PREFIX)
    return digest if _HEX64.fullmatch(digest) else None
