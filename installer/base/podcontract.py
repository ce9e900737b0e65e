"""The pod contract (docs/contract.md §2): where the DaemonSet mounts what, in one place.

Read by the options' defaults (settings, the CLI), the manifests that set the mounts up,
and doctor's advice; a host path and the container path it is mounted at are named apart.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from installer.base.dataclass import dataclass
from installer.base.kinds import DaemonName

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


# NVIDIA's daemons the DaemonSet runs as native sidecars (services/supervise.py runs and watches them).
@dataclass(frozen=True)
class Daemon:
    """One of NVIDIA's daemons the DaemonSet runs as a sidecar: every name it goes by."""

    # Its state file (<install-dir>/daemons/<name>.json), --require-daemon's value and its
    # word in driver-ready's DAEMONS line.
    name: DaemonName
    command: str  # its sidecar: `nvidia-driver-installer sidecar <command>` (daemons_cli)
    container: str  # the sidecar container's name in the rendered DaemonSet
    binary: str  # NVIDIA's program the sidecar runs
    # manifests render's flag adding the sidecar (`--<flag>`; RenderOptions' field)
    render_flag: str
    why: tuple[str, ...]  # the rendered sidecar's comment
    # The env var naming its config file, set when manifests render is given a ConfigMap of
    # it (None: it takes none).
    config_env: str | None = None


# Every daemon, in the order their sidecars start (before the install: each waits for the
# driver). A new daemon: its line here and its `sidecar` command (daemons_cli);
# services/supervise.py keeps each sidecar's state file.
DAEMONS: tuple[Daemon, ...] = (
    Daemon("fabricmanager", "fabric-manager", "nvidia-fabricmanager", "nv-fabricmanager",
           "nvswitch", ("NVIDIA's fabric manager of exactly the installed driver: on NVSwitch",
                        "nodes CUDA fails with 802 until it has trained the NVLink fabric."),
           config_env="NVIDIA_FABRIC_MANAGER_CONFIG"),
    Daemon("persistenced", "persistenced", "nvidia-persistenced", "nvidia-persistenced",
           "persistenced", ("nvidia-persistenced keeps the GPUs initialised with no client",
                            "(the 580 driver calls `nvidia-smi -pm 1` deprecated).")),
)
DAEMON_NAMES: tuple[DaemonName, ...] = tuple(d.name for d in DAEMONS)
