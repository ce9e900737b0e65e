"""What a node shows of GKE's own driver installer, for ``doctor``.

Both installers flock the same host lock, so they never run at once, but each re-installs
after the other: the operator must remove one (docs/operator/gke.md, "Switching from GKE's installer").
Read-only, from the host:

- the kubelet's pod log dirs: ``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<n>.log``
  (kubernetes pkg/kubelet/kuberuntime/helpers.go, BuildPodLogsDirectory and
  BuildContainerLogsDirectory). GKE's DaemonSet is ``kube-system/nvidia-driver-installer``
  (container-engine-accelerators nvidia-driver-installer/{cos,ubuntu}/daemonset*.yaml,
  metadata), so its pods are ``nvidia-driver-installer-`` and the 5 characters the API
  server's name generator appends (k8s.io/apiserver pkg/storage/names, utilrand.String:
  ``bcdfghjklmnpqrstvwxz2456789``); ours always carry the flavour (``…-cos-…``). A pod of
  that name logging our JSON events runs our image in GKE's DaemonSet (README, "Replacing
  GKE's installer"): not GKE's installer;
- the ``.cache`` record: GKE's installers write ``CACHE_BUILD_ID``/``CACHE_KERNEL_VERSION``
  and ``CACHE_NVIDIA_DRIVER_VERSION`` only (cos-gpu-installer entrypoint.sh L184-187);
  ours always adds ``CACHE_WRITTEN_BY`` (installer.records.cache.write).
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath

from installer.base.dataclass import dataclass

POD_LOGS_DIR = PurePosixPath("/var/log/pods")
GKE_POD_DIR = re.compile(r"kube-system_nvidia-driver-installer-[bcdfghjklmnpqrstvwxz2456789]{5}_"
                         r"[0-9a-f-]{1,64}")
INSTALLER_CONTAINER = "nvidia-driver-installer"  # GKE's init container name, as ours
MAX_POD_DIRS = 10_000  # a node runs at most a few hundred pods: bounded whatever is there
TAIL_BYTES = 64 << 10


@dataclass(frozen=True)
class GkePod:
    host_dir: str  # /var/log/pods/kube-system_nvidia-driver-installer-x2b4z_<uid>
    runs_ours: bool | None  # None: no log line yet to tell


def gke_pods(pods_dir: Path) -> list[GkePod]:
    """Pods of GKE's installer DaemonSet whose logs the kubelet keeps on this node."""
    found = []
    try:
        entries = sorted(e.name for _, e in zip(range(MAX_POD_DIRS), pods_dir.iterdir(),
                                                strict=False))
    except OSError:
        return []
    for name in entries:
        if GKE_POD_DIR.fullmatch(name):
            found.append(GkePod(str(POD_LOGS_DIR / name),
                                _logs_ours(pods_dir / name / INSTALLER_CONTAINER)))
    return found


def _logs_ours(container_dir: Path) -> bool | None:
    """Whether the container's newest log holds our JSON events (CRI log lines:
    ``<time> <stream> <P|F> <text>``)."""
    try:
        # Regular files only: a FIFO or a link planted there must not hang or lead doctor.
        logs = sorted((p for p in container_dir.glob("*.log")
                       if p.is_file() and not p.is_symlink()), key=lambda p: p.stat().st_mtime)
        if not logs:
            return None
        with logs[-1].open("rb") as f:
            f.seek(max(0, logs[-1].stat().st_size - TAIL_BYTES))
            tail = f.read(TAIL_BYTES).decode(errors="replace")
    except OSError:
        return None
    lines = [ln.split(" ", 3)[-1] for ln in tail.splitlines() if ln.strip()]
    if not lines:
        return None
    return any(_our_event(text) for text in lines)


def _our_event(text: str) -> bool:
    if not text.startswith("{"):
        return False
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    return isinstance(doc, dict) and "event" in doc and "level" in doc


def cache_written_by_gke(fields: dict[str, str]) -> bool:
    """A ``.cache`` GKE's installer wrote (it has none of our own lines)."""
    return bool(fields) and "CACHE_WRITTEN_BY" not in fields
