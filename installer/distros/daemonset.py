"""What a distro's DaemonSet needs besides the pod contract (docs/contract.md §2): its own
host mounts, the env naming them, the node's network. Each Distro declares one;
manifests/render.py and the template loop over it. Pure data."""

from __future__ import annotations

from installer.base.dataclass import dataclass


@dataclass(frozen=True)
class HostMount:
    name: str  # the pod volume's name
    host_path: str
    mount_path: str  # in the init container
    type: str  # hostPath type: Directory (must exist) or DirectoryOrCreate
    why: str = ""  # one comment line above the volume


@dataclass(frozen=True)
class DaemonSetNeeds:
    mounts: tuple[HostMount, ...] = ()
    # Env naming the mounts: fixed, so ``manifests render --env`` cannot change them.
    env: tuple[tuple[str, str], ...] = ()
    # Installer env vars only this distro reads: ``--env`` sets them on its DaemonSet only.
    own_env: tuple[str, ...] = ()
    # Why the pod uses the node's network (comment lines); empty: the pod network.
    host_network: tuple[str, ...] = ()
    # GKE runs its MIG partitioner after the install here (manifests render --partition-gpus).
    partition_gpus: bool = False
