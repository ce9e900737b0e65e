"""The flow that plans installs on a recognised host: each way of installing, by the name
a distro's facts give as its ``flow`` (``base.Distro.flow``), imported here, not where
hosts are only recognised. A distro that installs as another does adds nothing here.

Each flow is imported only when a host needs it: an Ubuntu node's every boot (a cache hit)
does not load COS's flow and its toolchain, mirror and jail modules (docs/performance.md).
The imports sit inside the loaders below, not in a module name in a string, so the layers
contract and tests/importgraph.py see every edge (as cli.COMMANDS does for the commands).
"""

from __future__ import annotations

from collections.abc import Callable

from installer.base.errors import UnsupportedHostError
from installer.distros import DISTROS, by_name
from installer.distros.planning import Flow
from installer.host.osinfo import HostInfo


def _cos() -> type[Flow]:
    # COS's flow: its toolchain, mirror, precompiled and jail modules, for COS hosts only
    from installer.distros.cos.flow import CosFlow

    return CosFlow


def _headers_build() -> type[Flow]:
    # the headers build (Ubuntu, Debian) and the bundle fetch it may take
    from installer.distros.headers_build_flow import HeadersBuildFlow

    return HeadersBuildFlow


# flow name -> its loader (the flow class, imported when called).
FLOWS: dict[str, Callable[[], type[Flow]]] = {"cos": _cos, "headers_build": _headers_build}


def for_host(info: HostInfo) -> Flow:
    distro = by_name(info.distro)
    load = FLOWS.get(distro.flow) if distro is not None else None
    if distro is None or load is None:
        raise UnsupportedHostError(
            f"no installer flow for {info.os_id}",
            hint=f"supported: {', '.join(d.name for d in DISTROS)}",
        )
    return load()(distro)
