"""What a cached install is keyed by (``CacheKey``) and where its modules came from
(``ModuleSource``): plain values, read by the distros' facts and written by ``cache``."""

from __future__ import annotations

import enum
from dataclasses import field

from installer.base.dataclass import dataclass
from installer.base.kinds import ModuleType


class ModuleSource(enum.Enum):
    """Where an install's kernel modules came from."""

    PREBUILT = "prebuilt"  # the COS build's signed open modules (nvidia-drivers-<V>.tgz)
    # NVIDIA's precompiled proprietary interfaces linked on the node, Google-signed (COS)
    PRECOMPILED = "precompiled"
    COMPILED = "compiled"  # built by nvidia-installer (here, or in a fleet's bundle)


@dataclass(frozen=True)
class CacheKey:
    """What a cached install must match: the OS build (COS) or kernel (Ubuntu), and the driver."""

    driver_version: str
    kernel_release: str | None = None  # Ubuntu
    build_id: str | None = None  # COS
    source: ModuleSource | None = None  # None: any source is a hit
    module_type: ModuleType | None = None  # None: any
    # Lines another installer reads (COS: cos-gpu-installer v2's keys), from the distro.
    compat_lines: tuple[str, ...] = field(default=(), compare=False)

    def describe(self) -> str:
        target = f"build {self.build_id}" if self.build_id else f"kernel {self.kernel_release}"
        return f"driver {self.driver_version} for {target}"
