"""What the manifests are made of: flavours, the pod contract's env and mounts, defaults, names.

One DaemonSet flavour per distro class, with what the class declares about itself
(``Distro.daemonset``); the pod contract (docs/contract.md §2) comes from
``installer.base.podcontract``, the env the installer reads from ``installer.base.envvars``.
"""

from __future__ import annotations

import re
from typing import Any

from installer import __version__
from installer.base import podcontract
from installer.distros import DISTROS
from installer.distros.daemonset import HostMount

FLAVORS: tuple[str, ...] = tuple(d.name for d in DISTROS)
FLAVOR_TITLES = {d.name: d.title for d in DISTROS}
DISTROS_BY_FLAVOR = {d.name: d for d in DISTROS}
# The images those DaemonSets run (images/<flavor>/Dockerfile): Debian's runs Ubuntu's.
IMAGE_FLAVORS: tuple[str, ...] = tuple(dict.fromkeys(d.image() for d in DISTROS))

# The pod contract. Fixed: the mounts and these env values must agree, so ``--env``
# cannot change them. Each distro adds its own (Distro.daemonset).
HOST_ROOT_CONTAINER = str(podcontract.HOST_ROOT)
INSTALL_DIR_HOST = str(podcontract.INSTALL_DIR_HOST)
INSTALL_DIR_CONTAINER = str(podcontract.INSTALL_DIR_CONTAINER)
CONTRACT_ENV: dict[str, str] = {
    "ROOT_MOUNT_DIR": HOST_ROOT_CONTAINER,
    "NVIDIA_INSTALL_DIR_HOST": INSTALL_DIR_HOST,
    "NVIDIA_INSTALL_DIR_CONTAINER": INSTALL_DIR_CONTAINER,
}
CONTRACT_MOUNTS: tuple[HostMount, ...] = (
    HostMount("root-mount", "/", HOST_ROOT_CONTAINER, "Directory",
              "The whole host root: os-release, kernel headers, ld.so.conf, lock."),
    HostMount("dev", "/dev", "/dev", "Directory"),
    HostMount("nvidia-install-dir-host", INSTALL_DIR_HOST, INSTALL_DIR_CONTAINER,
              "DirectoryOrCreate", f"Workloads mount {INSTALL_DIR_HOST}/{{bin,lib64}} later."),
)
# Env a distro's DaemonSet fixes (its mounts' paths): no --env may set them.
FIXED_ENV: frozenset[str] = frozenset(CONTRACT_ENV).union(
    *({k for k, _ in d.daemonset.env} for d in DISTROS))
# Env only some distros read: set on their DaemonSets only.
OWN_ENV: frozenset[str] = frozenset().union(*(d.daemonset.own_env for d in DISTROS))

DEFAULT_DRIVER_VERSION = {d.name: d.default_version for d in DISTROS}
# No image of this project is published: the default names a registry that cannot exist
# (.invalid, RFC 2606), marked PLACEHOLDER in what is rendered; `manifests render --image`
# (the command `make push` prints) replaces it with the images you pushed.
PLACEHOLDER_REGISTRY = "registry.invalid"
DEFAULT_IMAGE_REPO = PLACEHOLDER_REGISTRY + "/nvidia-driver-installer-{flavor}"
DEFAULT_PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
DEFAULT_NAMESPACE = "kube-system"
DEFAULT_LOG_FORMAT = "json"
# Wait up to 10 minutes for another installer (GKE's own, or a previous pod
# still finishing) instead of failing at once and crash-looping.
DEFAULT_LOCK_TIMEOUT = "600"
# A different driver in use: stage the new one for the next boot and let the pod run,
# instead of exit 8 and a crash-looping init container (the CLI's default is fail).
DEFAULT_WHEN_IN_USE = "stage"
AFFINITY_MODES: tuple[str, ...] = ("gke", "label", "none")
# Set by NVIDIA's GPU feature discovery / the GPU operator's NFD rule: present on GPU
# nodes of most non-GKE clusters.
DEFAULT_NODE_LABELS: tuple[str, ...] = ("nvidia.com/gpu.present=true",)
# Node Feature Discovery's "system" source: the node's os-release ID. Where the labels do
# not tell the flavours apart, each DaemonSet requires its distro's os_ids here (every OS
# its flow serves, not the flavour's name), so no two land on one node.
OS_ID_LABEL = "feature.node.kubernetes.io/system-os_release.ID"
GKE_OS_LABEL = "cloud.google.com/gke-os-distribution"
# Values of GKE's cloud.google.com/gke-os-distribution label per flavour.
GKE_OS_DISTRIBUTIONS = {d.name: d.gke_os_distributions for d in DISTROS}

# GKE's MIG partitioner (partition_gpu/partition_gpu.go: a no-op without
# /etc/nvidia/gpu_config.json), in the DaemonSets of the distros GKE runs it for
# (DaemonSetNeeds.partition_gpus: COS).
PARTITION_GPUS_IMAGE = ("gcr.io/gke-release/nvidia-partition-gpu@sha256:"
                        "c54fd003948fac687c2a93a55ea6e4d47ffbd641278a9191e75e822fe72471c2")
PARTITION_GPUS_FLAVORS = tuple(d.name for d in DISTROS if d.daemonset.partition_gpus)
# Nodes never ours, whatever selects them: nodes whose driver GKE installs itself
# (gpu-driver-version set at node-pool creation) are left to GKE, as GKE's own manifests
# do; confidential GPU nodes (TDX, SEV) need GKE's own confidential DaemonSet.
GKE_GUARDS: tuple[dict[str, Any], ...] = (
    {"key": "cloud.google.com/gke-gpu-driver-version", "operator": "DoesNotExist"},
    {"key": "cloud.google.com/gke-confidential-nodes-instance-type", "operator": "DoesNotExist"},
)


def daemonset_name(flavor: str, instance: str | None = None) -> str:
    """``nvidia-driver-installer-<flavor>``, or ``…-<flavor>-<instance>`` for one DaemonSet
    per node pool (``--name``): its own metadata.name, instance label and selector."""
    return f"nvidia-driver-installer-{flavor}" + (f"-{instance}" if instance else "")


def daemonset_filename(flavor: str, instance: str | None = None) -> str:
    return f"daemonset-{flavor}" + (f"-{instance}" if instance else "") + ".yaml"


def image_tag() -> str:
    # Image tags allow [A-Za-z0-9_.-]: a local version ("0.1.0+g1234") becomes "0.1.0-g1234".
    return re.sub(r"[^A-Za-z0-9_.-]", "-", __version__)


def label_version() -> str:
    v = re.sub(r"[^A-Za-z0-9_.-]", "-", __version__)[:63]
    return v.strip("-_.") or "unknown"


def default_image(flavor: str) -> str:
    return f"{DEFAULT_IMAGE_REPO.format(flavor=flavor)}:{image_tag()}"


def is_placeholder(image: str) -> bool:
    return image.startswith(PLACEHOLDER_REGISTRY + "/")


def is_pinned(image: str) -> bool:
    return "@sha256:" in image
