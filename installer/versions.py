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
