"""One class per host OS family, found through a registry keyed by ``HostInfo.family``."""

from __future__ import annotations

from installer.distros.base import Distro
from installer.errors import UnsupportedHostError
from installer.osinfo import HostInfo


def _registry() -> dict[str, type[Distro]]:
    from installer.distros.cos import Cos
    from installer.distros.ubuntu import Ubuntu

    return {"cos": Cos, "ubuntu": Ubuntu}


def for_host(info: HostInfo) -> Distro:
    registry = _registry()
    try:
        return registry[info.family]()
    except KeyError:
        raise UnsupportedHostError(
            f"no installer flow for {info.os_id}",
            hint=f"supported: {', '.join(sorted(registry))}",
        ) from None
