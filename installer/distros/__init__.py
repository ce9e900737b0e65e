"""One class per host OS family, found through a registry keyed by ``HostInfo.family``."""

from __future__ import annotations

import importlib

from installer.distros.base import Distro
from installer.errors import UnsupportedHostError
from installer.osinfo import HostInfo

# Imported only for the host's family: the COS flow pulls in requests, tenacity
# and tarfile, which an Ubuntu cache hit does not need (see bench/cache_hit.py).
FLOWS = {"cos": "installer.distros.cos.flow:Cos", "ubuntu": "installer.distros.ubuntu:Ubuntu"}


def _flow(family: str) -> type[Distro]:
    module, attr = FLOWS[family].split(":")
    return getattr(importlib.import_module(module), attr)


def _registry() -> dict[str, type[Distro]]:
    return {family: _flow(family) for family in FLOWS}


def for_host(info: HostInfo) -> Distro:
    if info.family not in FLOWS:
        raise UnsupportedHostError(
            f"no installer flow for {info.os_id}",
            hint=f"supported: {', '.join(sorted(FLOWS))}",
        )
    return _flow(info.family)()
