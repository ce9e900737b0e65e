"""cos-gpu-installer v2's keys in our ``.cache``, so each installer takes the other's
install of the same build and driver as a cache hit.

v2 (cos/tools ``src/cmd/cos_gpu_installer/internal/installer/cache.go`` L14-20,
L73-85) writes ``BUILD_ID=``, ``DRIVER_VERSION=`` and, when it installed the open
modules, ``KERNEL_OPEN=Y``; it hits when both values equal its own. Its reader
(``src/pkg/utils/utils.go`` ``LoadEnvFromFile`` L227-255) fails on any non-blank
line without ``=``, so our record must have no comment line.
"""

from __future__ import annotations

from dataclasses import replace

from installer.base.kinds import OPEN
from installer.records.cache import V2_KERNEL_OPEN_KEY, CacheKey


def v2_lines(build_id: str | None, driver_version: str, module_type: str | None) -> list[str]:
    """The lines v2 reads (COS only: v2 keys its cache by the COS build)."""
    if not build_id:
        return []
    lines = [f"BUILD_ID={build_id}", f"DRIVER_VERSION={driver_version}"]
    if module_type == OPEN:
        lines.append(f"{V2_KERNEL_OPEN_KEY}=Y")
    return lines


def with_v2_lines(key: CacheKey) -> CacheKey:
    """``key`` writing v2's lines too, so v2 takes our install as its own cache hit
    (v2's records are read by cache.read)."""
    return replace(key, compat_lines=tuple(v2_lines(key.build_id, key.driver_version,
                                                     key.module_type)))

