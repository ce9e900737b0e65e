"""The flow that plans installs on a recognised host: each way of installing, by the name
a distro's facts give as its ``flow`` (``base.Distro.flow``), imported here, not where
hosts are only recognised. A distro that installs as another does adds nothing here."""

from __future__ import annotations

from installer.base.errors import UnsupportedHostError
from installer.distros import DISTROS, by_name
from installer.distros.cos.flow import CosFlow
from installer.distros.headers_build_flow import HeadersBuildFlow
from installer.distros.planning import Flow
from installer.host.osinfo import HostInfo

FLOWS: dict[str, type[Flow]] = {"cos": CosFlow, "headers_build": HeadersBuildFlow}


def for_host(info: HostInfo) -> Flow:
    distro = by_name(info.distro)
    flow = FLOWS.get(distro.flow) if distro is not None else None
    if distro is None or flow is None:
        raise UnsupportedHostError(
            f"no installer flow for {info.os_id}",
            hint=f"supported: {', '.join(d.name for d in DISTROS)}",
        )
    return flow(distro)
