"""A fixture Ubuntu node the benches install on, the way the DaemonSet's pod does.

Built from the test fixtures (tests/fixtures: node tree, FakeKernel + fake kmod
tools, makeself NVIDIA .run, HTTPS ArtifactServer) and run through
tests/pod.py's chroot, as ``make demo`` and the integration tests do.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from _common import REPO

RELEASE = "5.15.0-1049-gke"
VERSION = "550.54.14"
CLI = Path(sys.executable).parent / "nvidia-driver-installer"


def can_run_pods() -> str | None:
    """Why the pod-like chroot cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (mount namespaces, chroot), like make demo"
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"the kernel refused a mount namespace: {probe.stderr.strip()}"
    return None


def _pod_class():
    from tests.pod import POD_PATH, Pod

    class TimedPod(Pod):
        """tests.pod.Pod running bench/_timer.py around any command, optionally with a
        directory mounted over the container's /sys/fs/cgroup."""

        cgroup_dir: Path | None = None

        def _script(self, cli: list[str], env: dict[str, str], *args) -> str:
            script = super()._script(cli, env, *args)
            if self.cgroup_dir is None:
                return script
            rootfs = self.scratch / "rootfs"
            anchor = f"mount --rbind /sys {rootfs}/sys"
            if anchor not in script:
                raise RuntimeError("tests/pod.py changed shape: cannot mount a fake cgroup fs")
            return script.replace(
                anchor, f"{anchor}\nmount --bind {self.cgroup_dir} {rootfs}/sys/fs/cgroup")

        def timed(self, cmd: list[str], env: dict[str, str] | None = None,
                  timeout: float = 600) -> dict:
            full_env = {"PATH": POD_PATH, "LOG_FORMAT": "json", **self.env, **(env or {})}
            cli = [sys.executable, str(REPO / "bench/_timer.py"), *[str(c) for c in cmd]]
            proc = subprocess.run(
                ["unshare", "--mount", "--pid", "--fork", "--", "sh", "-ec",
                 self._script(cli, full_env)],
                capture_output=True, text=True, timeout=timeout, env={"PATH": POD_PATH})
            if proc.returncode != 0 or not proc.stdout.strip():
                raise SystemExit(f"pod failed ({proc.returncode}): {proc.stderr[-3000:]}")
            return json.loads(proc.stdout.strip().splitlines()[-1])

    return TimedPod


@dataclass
class Fixture:
    node: object  # tests.fixtures.node.Node
    kernel: object  # tests.fixtures.kernel.FakeKernel
    pod: object  # TimedPod
    server_url: str


@contextlib.contextmanager
def fixture(work: Path, also_serve: tuple[str, ...] = ()) -> Iterator[Fixture]:
    """Node, kernel, .run on an HTTPS server, and a pod wired to them (server up inside);
    ``also_serve``: more driver versions on the same server."""
    from tests.fixtures.runfile import build_driver_run
    from tests.pod import ubuntu_pod

    with ubuntu_pod(work, version=VERSION, release=RELEASE,
                    pod_class=_pod_class()) as (node, kernel, server, pod):
        for version in also_serve:
            server.serve_run(version, build_driver_run(work / "runs", version))
        yield Fixture(node, kernel, pod, server.url)


def events(stderr: str) -> list[dict]:
    """The JSON log events in a run's stderr."""
    from tests.pod import events as pod_events

    return [e for e in pod_events(stderr) if "raw" not in e]
