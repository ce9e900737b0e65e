"""podman as this tier's kubelet: private configuration, runc, cgroupfs, host network.

What podman 4.3.1 (Debian bookworm) needs to run pod YAML on these CI machines:

- runc: crun 1.8.1 refuses their hybrid cgroup hierarchy;
- ``default_ulimits`` within this process's hard limits: podman's default nofile
  of 1048576 fails with ``setrlimit … Operation not permitted`` (no
  CAP_SYS_RESOURCE here);
- ``cgroup_manager=cgroupfs``, ``events_logger=file``, ``log_driver=k8s-file``:
  neither systemd nor journald runs here;
- host networking only: the default CNI bridge leaves ``cni-podman0`` and
  iptables chains behind.

Storage is images/build.sh's own store (``NDI_BUILDAH_ROOT``/``NDI_BUILDAH_RUNROOT``,
under /var/cache/ndi-images), so the images tier and this one build the images
once, and nothing lands in /var/lib/containers. libpod's database stays at its
default, inside that store (``<graphroot>/libpod``): conmon's exit command
(``podman container cleanup``) is not told about another ``static_dir``, the
exit code then never reaches the database and every wait stalls 20 s. That
database records ``tmp_dir`` when it is created and overrides the config with it
afterwards: changing TMP_DIR takes a new store (or removing ``<graphroot>/libpod``).
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("NDI_IMAGE_CACHE", "/var/cache/ndi-images"))
GRAPHROOT = os.environ.get("NDI_BUILDAH_ROOT", str(CACHE / "storage"))
RUNROOT = os.environ.get("NDI_BUILDAH_RUNROOT", "/run/ndi-images")
TMP_DIR = f"{RUNROOT}/libpod"  # libpod's runtime state (exit files, events), one per store
TOOLS = ("podman", "runc", "catatonit", "buildah")
# The pod annotation that keeps a finished init container, its logs and exit code
# (podman 4.3.1's default, "once", deletes it).
INIT_TYPE_ANNOTATION = "io.podman.annotations.init.container.type"
# A podman-made Pod names its containers <pod>-<container>.
POD_CONTAINER = "{pod}-{container}"


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def _ulimit(kind: int, cap: int) -> str:
    """soft=hard=this process's hard limit, or `cap` below it (podman cannot raise it)."""
    hard = resource.getrlimit(kind)[1]
    value = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
    return f"{value}:{value}"


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


# podman 4.3 (Debian 12's 4.3.1) reads /proc/<pid>/cgroup of a running container's process
# to inspect it; when that process exits between the open and the read, the kernel answers
# ESRCH and inspect fails with rc 125 and this message (podman issue #16383, fixed in 4.4 by
# PR #16504, "libpod: treat ESRCH from /proc/PID/cgroup as ENOENT"). Seen in a fresh-clone
# CI run: an init container that exited during the pod tier's state poll. The container is
# then stopped: inspecting it again answers its exit.
EXITED_WHILE_INSPECTED = re.compile(r"read /proc/\d+/cgroup: no such process")
INSPECT_TRIES = 3


def _failed(args: tuple[str, ...], out: subprocess.CompletedProcess[str]) -> AssertionError:
    return AssertionError(f"podman {' '.join(args)}: rc {out.returncode}\n{out.stderr[-3000:]}")


@dataclass
class Podman:
    conf_dir: Path  # holds containers.conf, storage.conf and the pod YAML files

    @classmethod
    def create(cls, conf_dir: Path) -> Podman:
        conf_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / "storage.conf").write_text(
            '[storage]\ndriver = "overlay"\n'
            f"graphroot = {json.dumps(GRAPHROOT)}\nrunroot = {json.dumps(RUNROOT)}\n")
        # podman drops its own nproc limit to 32768 when it starts (seen: 32769 fails
        # with EPERM where this process's hard limit is 96365).
        ulimits = [f"nofile={_ulimit(resource.RLIMIT_NOFILE, 1 << 20)}",
                   f"nproc={_ulimit(resource.RLIMIT_NPROC, 32768)}"]
        (conf_dir / "containers.conf").write_text(
            "[containers]\n"
            f"default_ulimits = {_toml_list(ulimits)}\n"
            'log_driver = "k8s-file"\n'
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            'runtime = "runc"\n'
            f"tmp_dir = {json.dumps(TMP_DIR)}\n")
        return cls(conf_dir)

    def env(self) -> dict[str, str]:
        return {**os.environ,
                "CONTAINERS_CONF": str(self.conf_dir / "containers.conf"),
                "CONTAINERS_STORAGE_CONF": str(self.conf_dir / "storage.conf")}

    def __call__(self, *args: str, check: bool = True, timeout: float = 120,
                 stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["podman", *args], input=stdin, capture_output=True,
                              timeout=timeout, env=self.env())
        out = subprocess.CompletedProcess(proc.args, proc.returncode,
                                          proc.stdout.decode(errors="replace"),
                                          proc.stderr.decode(errors="replace"))
        if check and out.returncode:
            raise _failed(args, out)
        return out

    # -- images ---------------------------------------------------------------

    def pause_image(self, name: str = "localhost/ndi-pause:catatonit") -> str:
        """A pause image made of catatonit (`catatonit -P` only waits for signals)."""
        if self("image", "exists", name, check=False).returncode == 0:
            return name
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            shutil.copy2(shutil.which("catatonit"), root / "pause")
            for d in ("dev", "proc", "sys", "etc"):
                (root / d).mkdir()
            tar = subprocess.run(["tar", "--numeric-owner", "--owner=0", "--group=0",
                                  "-C", tmp, "-c", "."], capture_output=True, check=True).stdout
        self("import", "--change", 'ENTRYPOINT ["/pause", "-P"]', "-", name, stdin=tar)
        return name

    def image_rootfs_listing(self, image: str, path: str) -> list[str]:
        """Names under `path` in the image's own rootfs (not a container's view)."""
        mnt = Path(self("image", "mount", image).stdout.strip())
        try:
            return sorted(p.name for p in (mnt / path.lstrip("/")).iterdir())
        finally:
            self("image", "unmount", image, check=False)

    # -- pods -----------------------------------------------------------------

    def create_pod(self, pod: dict) -> subprocess.CompletedProcess[str]:
        """`podman kube play --start=false` one Pod: its containers created, none started
        (tests/pod_tier/lifecycle.py starts them in the kubelet's order).

        --network host whatever the manifest says (no CNI bridge on this machine).
        """
        import yaml

        path = self.conf_dir / f"{pod['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(pod, sort_keys=False))
        return self("kube", "play", "--start=false", "--network", "host", str(path), check=False)

    def inspect(self, container: str) -> dict:
        """``podman container inspect``, read again when the container's process exited while
        podman read its cgroup (``EXITED_WHILE_INSPECTED``), at most ``INSPECT_TRIES`` times."""
        args = ("container", "inspect", container)
        for _ in range(INSPECT_TRIES):
            out = self(*args, check=False)
            if not (out.returncode and EXITED_WHILE_INSPECTED.search(out.stderr)):
                break
        if out.returncode:
            raise _failed(args, out)
        (doc,) = json.loads(out.stdout)
        return doc

    def logs(self, container: str) -> str:
        """stdout and stderr of the container interleaved, as `kubectl logs` shows them."""
        proc = subprocess.run(["podman", "logs", container], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=60, env=self.env())
        assert proc.returncode == 0, proc.stdout[-3000:]
        return proc.stdout

    def remove_pod(self, name: str) -> None:
        self("pod", "rm", "--force", "--time", "0", "--ignore", name, check=False)

    def pod_exists(self, name: str) -> bool:
        """(A pod's containers go with it: podman removes no pod that still has any.)"""
        return self("pod", "exists", name, check=False).returncode == 0
