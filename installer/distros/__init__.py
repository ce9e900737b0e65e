"""One class per host OS family; each declares how it is recognised (cloud-init's
distros own their OS-family membership the same way)."""

from __future__ import annotations

import os
from pathlib import Path

from installer.base import podcontract
from installer.base.errors import UnsupportedHostError
from installer.distros.base import Distro
from installer.distros.cos.host import Cos
from installer.distros.debian import Debian
from installer.distros.ubuntu import Ubuntu
from installer.host.hostroot import HostRoot
from installer.host.osinfo import HostInfo, os_release_fields

# Every distro, in the order they are tried (and rendered: one DaemonSet each).
DISTROS: tuple[type[Distro], ...] = (Cos, Ubuntu, Debian)
# The bundle-job's image: GKE's Ubuntu kernels, whose headers its apt installs.
BUNDLE_BUILDER: type[Distro] = Ubuntu


def by_name(name: str) -> type[Distro] | None:
    return next((d for d in DISTROS if d.name == name), None)


def recognise(fields: dict[str, str], lsb_release: str | None, kernel_release: str,
              os_release_path: str) -> HostInfo:
    for distro in DISTROS:
        info = distro.recognise(fields, lsb_release, kernel_release, os_release_path)
        if info is not None:
            return info
    os_id = fields.get("ID", "").lower()
    raise UnsupportedHostError(
        f"unsupported host OS {os_id!r} ({fields.get('PRETTY_NAME', os_id)})",
        hint="supported: " + ", ".join(
            f"{d.title} (ID={'/'.join(d.os_ids)})" for d in DISTROS),
        path=os_release_path,
    )


def host_info_from_text(os_release: str | None, lsb_release: str | None, kernel_release: str,
                        *, os_release_path: str = "/etc/os-release") -> HostInfo:
    """The host facts from its os-release and lsb-release texts (UnsupportedHostError)."""
    fields = os_release_fields(os_release, os_release_path)
    return recognise(fields, lsb_release, kernel_release, os_release_path)


def support(info: HostInfo) -> str:
    """How the host is served: "supported", "not tested: pop follows the Ubuntu flow …"."""
    distro = by_name(info.distro)
    return distro.support(info) if distro else "unsupported"


def detect(host: HostRoot, kernel_release: str) -> HostInfo:
    """The host's OS from its os-release and lsb-release (UnsupportedHostError: not one
    of ours)."""
    os_release = host.read_text("/etc/os-release")
    if os_release is None and _run_by_hand_on_the_node(host):
        raise UnsupportedHostError(
            f"cannot read {host.path('/etc/os-release')}: --host-root is {host.root}, but this "
            "runs on the node itself, not in the installer's pod",
            hint="pass --host-root / (or ROOT_MOUNT_DIR=/) when running on the node by hand",
            path=str(host.path("/etc/os-release")))
    return host_info_from_text(
        os_release,
        host.read_text("/etc/lsb-release"),
        kernel_release,
        os_release_path=str(host.path("/etc/os-release")),
    )


# Files container runtimes create in every container (docker, podman / CRI-O).
CONTAINER_MARKERS = (Path("/.dockerenv"), Path("/run/.containerenv"))


def _run_by_hand_on_the_node(host: HostRoot) -> bool:
    """The default --host-root /root, outside any container (so / is the host's own)."""
    return (host.root == podcontract.HOST_ROOT and Path("/etc/os-release").is_file()
            and not any(m.exists() for m in CONTAINER_MARKERS)
            and "KUBERNETES_SERVICE_HOST" not in os.environ)
