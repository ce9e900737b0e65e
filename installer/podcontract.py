"""The pod contract (docs/contract.md §2): where the DaemonSet mounts what, in one place.

Read by the options' defaults (settings, the CLI), the manifests that set the mounts up,
and doctor's advice; a host path and the container path it is mounted at are named apart.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

# The host's / inside the container (ROOT_MOUNT_DIR).
HOST_ROOT = Path("/root")
# The driver's install dir: GKE's layout, which workloads mount as /usr/local/nvidia/{bin,lib64}
# (NVIDIA_INSTALL_DIR_HOST, NVIDIA_INSTALL_DIR_CONTAINER).
INSTALL_DIR_HOST = PurePosixPath("/home/kubernetes/bin/nvidia")
INSTALL_DIR_CONTAINER = Path("/usr/local/nvidia")
# COS only: GKE's cache of the COS toolchain and headers (COS_TOOLS_DIR_HOST,
# COS_TOOLS_DIR_CONTAINER), as GKE's COS DaemonSets mount it.
COS_TOOLS_DIR_HOST = PurePosixPath("/var/lib/cos-tools")
COS_TOOLS_DIR_CONTAINER = Path("/build/cos-tools")
# COS only: where GKE's COS DaemonSets put the Vulkan ICD file (VULKAN_ICD_DIR_HOST).
VULKAN_ICD_DIR_HOST = INSTALL_DIR_HOST / "vulkan/icd.d"
VULKAN_ICD_DIR_CONTAINER = Path("/etc/vulkan/icd.d")
