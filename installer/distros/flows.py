"""The flow that plans installs on a recognised host: the distro class itself, or for COS
its heavier ``CosFlow`` (imported here, not where hosts are only recognised)."""

from __future__ import annotations

from installer.distros import DISTROS
from installer.distros.base import Distro
from installer.distros.cos.flow import CosFlow
from installer.errors import UnsupportedHostError
from installer.osinfo import HostInfo

FLOWS: dict[str, type[Distro]] = {d.name: d for d in DISTROS} | {CosFlow.name: CosFlow}


def for_host(info: HostInfo) -> Distro:
    flow = FLOWS.get(info.family)
    if flow is None:
        raise UnsupportedHostError(
            f"no installer flow for {info.os_id}",
            hint=f"supported: {', '.join(d.name for d in DISTROS)}",
        )
    return flow()
