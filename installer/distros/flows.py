"""The flow that plans installs on a recognised host: each distro's facts with its way of
installing (``planning.Flow``), imported here, not where hosts are only recognised."""

from __future__ import annotations

from installer.distros import DISTROS
from installer.distros.cos.flow import CosFlow
from installer.distros.debian import Debian
from installer.distros.headers_build_flow import HeadersBuildFlow
from installer.distros.planning import Flow
from installer.distros.ubuntu import Ubuntu
from installer.errors import UnsupportedHostError
from installer.osinfo import HostInfo


class UbuntuFlow(HeadersBuildFlow, Ubuntu):
    """Ubuntu's installs: built against the host kernel's headers."""


class DebianFlow(HeadersBuildFlow, Debian):
    """Debian's installs: as Ubuntu's."""


FLOWS: dict[str, type[Flow]] = {f.name: f for f in (CosFlow, UbuntuFlow, DebianFlow)}


def for_host(info: HostInfo) -> Flow:
    flow = FLOWS.get(info.distro)
    if flow is None:
        raise UnsupportedHostError(
            f"no installer flow for {info.os_id}",
            hint=f"supported: {', '.join(d.name for d in DISTROS)}",
        )
    return flow()
