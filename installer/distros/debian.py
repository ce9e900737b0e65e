"""Debian: the driver built against the host kernel's headers (HeadersBuild), as on Ubuntu
(same packaging, same split kernel headers: the VM and realparts tiers run it on Debian 12
kernels)."""

from __future__ import annotations

from installer.distros.headers_build import HeadersBuild


class Debian(HeadersBuild):
    name = "debian"
    title = "Debian"
    os_ids = ("debian",)
    # GKE has no Debian node image: with --affinity gke its DaemonSet needs the node's
    # os-release ID label (Node Feature Discovery) and no GKE OS label.
    gke_os_distributions = ()
    # The Ubuntu image serves Debian nodes (its build tools and apt; the headers usually
    # come from the node, as apt there holds Ubuntu's kernels only).
    image_suffix = "ubuntu"
