"""Distros whose driver is compiled against the host kernel's headers (Ubuntu, Debian):
what they declare in common (the default version, the /boot mount). A subclass declares
who it is (names, OS ids, GKE labels, image); ``headers_build_flow`` plans its installs."""

from __future__ import annotations

import re
from typing import ClassVar

from installer.base import branches
from installer.distros.base import Distro
from installer.distros.daemonset import DaemonSetNeeds, HostMount

# As GKE's Ubuntu DaemonSet: /boot (the running kernel's config-<release> and System.map).
BOOT = HostMount("boot", "/boot", "/boot", "Directory",
                 "As GKE's Ubuntu DaemonSet: the kernel's config and System.map.")


class HeadersBuild(Distro):
    # A release of NVIDIA's current long-term branch (branches.py); NVIDIA_DRIVER_VERSION
    # picks another.
    default_version: ClassVar[str] = branches.RECOMMENDED_VERSION
    # `default` asks for default_version (driver_version below), by install and render alike.
    version_alias = re.compile("default")
    version_alias_help = f"default: {branches.RECOMMENDED_VERSION}, or R470 for Kepler GPUs"
    daemonset = DaemonSetNeeds(mounts=(BOOT,))
    flow: ClassVar[str] = "headers_build"  # headers_build_flow.HeadersBuildFlow
