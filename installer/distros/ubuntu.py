"""Ubuntu: the driver built against the host kernel's headers (HeadersBuild)."""

from __future__ import annotations

from installer.distros.headers_build import HeadersBuild


class Ubuntu(HeadersBuild):
    name = "ubuntu"
    title = "Ubuntu"
    # Derivatives (ID_LIKE=ubuntu) follow this flow and are reported as not tested.
    os_ids = ("ubuntu",)
    gke_os_distributions = ("ubuntu", "ubuntu_containerd")
