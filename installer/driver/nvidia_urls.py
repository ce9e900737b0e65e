"""Where NVIDIA's Linux driver .run files are and what they are called."""

from __future__ import annotations

import re

from installer.base.errors import UsageError
from installer.driver.nvidia_options import check_version

NVIDIA_BASE_URL = "https://us.download.nvidia.com/{branch}"
DEFAULT_DRIVER_BASE_URL = NVIDIA_BASE_URL.format(branch="tesla")
# NVIDIA's redistributable area: the fabric manager archives and redistrib_<V>.json.
FABRIC_MANAGER_BASE_URL = "https://developer.download.nvidia.com/compute/nvidia-driver/redist"

# NVIDIA-Linux-<arch>-<V>.run: x86_64 or aarch64 (cpuarch.py cites the layout).
_RUN_NAME = re.compile(r"NVIDIA-Linux-(x86_64|aarch64)-(\d[\d.]*\d)(?:-[\w.]+)?\.run$")


def run_file_name(version: str, arch: str = "x86_64") -> str:
    return f"NVIDIA-Linux-{arch}-{version}.run"


def run_url(base: str, version: str, arch: str = "x86_64") -> str:
    """``<base>/<V>/NVIDIA-Linux-<arch>-<V>.run``, NVIDIA's layout (and its mirrors'):
    both architectures' .run files in the one version directory."""
    return f"{base.rstrip('/')}/{version}/{run_file_name(version, arch)}"


def named_version(url: str) -> str | None:
    """The driver version a .run URL's file name names, if it does."""
    match = _RUN_NAME.search(url.split("?", 1)[0])
    return match.group(2) if match else None


def named_arch(url: str) -> str | None:
    """The architecture a .run URL's file name names (``x86_64``/``aarch64``), if it does."""
    match = _RUN_NAME.search(url.split("?", 1)[0])
    return match.group(1) if match else None


def version_from_url(url: str) -> str:
    """The driver version named by a .run URL (NVIDIA-Linux-x86_64-<V>.run)."""
    named = named_version(url)
    if named is None:
        raise UsageError(
            f"cannot tell the driver version from --driver-url {url}",
            hint="also pass --driver-version (NVIDIA_DRIVER_VERSION)",
        )
    return check_version(named)
