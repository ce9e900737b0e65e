"""Run the CLI the way the DaemonSet's init container does, against a fixture node.

Inside ``unshare --mount --pid --fork``: the container rootfs is an overlay of
this machine's / with a tmpfs upper dir (nothing the installer writes to its
"container" leaks out), the fixture node is bound at /root, the node's install
dir at /usr/local/nvidia, and /dev, /proc, /sys are mounted as in a privileged
pod. Stand-in tools (kmod, apt-get) go first on PATH inside the rootfs.
Everything disappears when the namespace exits.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.fixtures.kernel import UBUNTU_KERNEL

# The venv is made from Debian's python (/usr/bin/python3): pyenv's lives under
# /root, which the pod hides behind the fixture node.
PYTHON = sys.executable
POD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

FAKE_APT_GET = """#!/bin/sh
# Stand-in for apt-get in a container whose sources have no headers for this kernel.
echo "apt-get $*" >> "${FAKE_CALL_LOG:-/dev/null}"
case "$1" in
  update) exit 0 ;;
  install) for a in "$@"; do case "$a" in linux-headers-*) pkg=$a ;; esac; done
    echo "E: Unable to locate package $pkg" >&2
    echo "E: Couldn't find any package by glob '$pkg'" >&2
    exit 100 ;;
esac
exit 0
"""


@dataclass
class Pod:
    node_root: Path  # the fixture host's /
    install_dir: Path  # the host's /home/kubernetes/bin/nvidia inside node_root
    scratch: Path  # on the root filesystem (the overlay of / must see it)
    fakebin: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    # Dirs shared with the test at the same path (fake kernel state): writes must reach them,
    # not the rootfs overlay's throw-away upper dir.
    shared: list[Path] = field(default_factory=list)
    # False: no /usr/local/nvidia in the container, as under `kubectl debug` (the installer
    # then falls back to <host-root>/<install-dir-host>).
    mount_install_dir: bool = True

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 600,
            chroot: bool = True, install_dir_tmpfs: str | None = None,
            export_install_dir: Path | None = None, module: str = "installer",
            busy: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        """Run the CLI in the pod.

        ``install_dir_tmpfs="300k"`` puts the install dir on a tmpfs of that size, seeded
        with the node's install dir (a nearly full disk); ``export_install_dir`` receives
        its contents after the run, since the tmpfs goes away with the namespace.
        ``module``: what ``python -m`` runs (tests.fixtures.failpoint: the CLI with a
        failure injected). ``busy``: container paths made mount points of themselves, so
        that renaming them fails (EBUSY) as on a node where something is mounted there.
        """
        full_env = {"PATH": POD_PATH, "LOG_FORMAT": "json", **self.env, **(env or {})}
        cli = [PYTHON, "-m", module, *args]
        if not chroot:
            run_env = {**os.environ, **full_env}
            run_env["PATH"] = f"{self.fakebin}:{run_env['PATH']}" if self.fakebin else run_env["PATH"]
            return subprocess.run(cli, env=run_env, capture_output=True, text=True,
                                  timeout=timeout, cwd=Path(__file__).resolve().parents[1])
        return subprocess.run(
            self._unshare(cli, full_env, install_dir_tmpfs, export_install_dir, busy),
            capture_output=True, text=True, timeout=timeout, env={"PATH": POD_PATH},
        )

    def start(self, *args: str, env: dict[str, str] | None = None,
              module: str = "installer") -> subprocess.Popen[str]:
        """Start the CLI in the pod in its own process group (so a test can SIGKILL it all);
        ``module`` as for run()."""
        full_env = {"PATH": POD_PATH, "LOG_FORMAT": "json", **self.env, **(env or {})}
        return subprocess.Popen(
            self._unshare([PYTHON, "-m", module, *args], full_env, None, None),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={"PATH": POD_PATH},
            start_new_session=True,
        )

    def _unshare(self, cli: list[str], env: dict[str, str], tmpfs_size: str | None,
                 export: Path | None, busy: tuple[str, ...] = ()) -> list[str]:
        return ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--", "sh", "-ec",
                self._script(cli, env, tmpfs_size, export, busy)]

    def _script(self, cli: list[str], env: dict[str, str], tmpfs_size: str | None = None,
                export: Path | None = None, busy: tuple[str, ...] = ()) -> str:
        s = self.scratch
        rootfs, layer = s / "rootfs", s / "layer"
        for d in (rootfs, layer):
            d.mkdir(parents=True, exist_ok=True)
        repo = Path(__file__).resolve().parents[1]
        q = shlex.quote
        host_install_dir = f"{rootfs}/root/{self.install_dir.relative_to(self.node_root)}"
        lines = [
            "mount --make-rprivate /",
            f"mount -t tmpfs tmpfs {q(str(layer))}",
            f"mkdir -p {q(str(layer))}/upper {q(str(layer))}/work",
            f"mount -t overlay overlay -o lowerdir=/,upperdir={layer}/upper,workdir={layer}/work "
            f"{q(str(rootfs))}",
            f"mkdir -p {rootfs}/root {rootfs}/usr/local/sbin",
            f"mount --bind {q(str(self.node_root))} {rootfs}/root",
            # The tmpfs goes on the host's install dir as the pod sees it, then is bound
            # at the container's: one dir under two names, as a hostPath volume is.
            (f"mkdir -p {rootfs}/usr/local/nvidia && "
             f"mount -t tmpfs -o size={tmpfs_size} tmpfs {q(host_install_dir)} && "
             f"cp -a {q(str(self.install_dir))}/. {q(host_install_dir)}/ && "
             f"mount --bind {q(host_install_dir)} {rootfs}/usr/local/nvidia")
            if tmpfs_size else
            f"mkdir -p {rootfs}/usr/local/nvidia && "
            f"mount --bind {q(str(self.install_dir))} {rootfs}/usr/local/nvidia"
            if self.mount_install_dir else f"rm -rf {rootfs}/usr/local/nvidia",
            f"mount --rbind /dev {rootfs}/dev",
            f"mount -t proc proc {rootfs}/proc",
            f"mount --rbind /sys {rootfs}/sys",
        ]
        for path in [*self.shared, *_tripwire_dirs(env)]:
            lines.append(f"mkdir -p {q(str(rootfs))}{q(str(path))}")
            lines.append(f"mount --bind {q(str(path))} {q(str(rootfs))}{q(str(path))}")
        for path in busy:
            lines.append(f"mount --bind {q(str(rootfs))}{q(path)} {q(str(rootfs))}{q(path)}")
        if self.fakebin:
            lines.append(f"cp -a {q(str(self.fakebin))}/. {rootfs}/usr/local/sbin/")
        lines.append(f"cat > {rootfs}/usr/local/sbin/apt-get <<'APT'\n{FAKE_APT_GET}APT")
        lines.append(f"chmod 755 {rootfs}/usr/local/sbin/apt-get")
        env_words = " ".join(q(f"{k}={v}") for k, v in env.items())
        inner = q(f"cd {q(str(repo))} && exec " + " ".join(q(c) for c in cli))
        if export is not None:
            lines.append(f"mkdir -p {q(str(export))} {q(str(rootfs))}{q(str(export))}")
            lines.append(f"mount --bind {q(str(export))} {q(str(rootfs))}{q(str(export))}")
        # The rootfs becomes the namespace's root as a runtime makes it (pivot_root, not
        # chroot): bwrap, the build jail, resolves its bind sources from that root.
        lines.append(f"cd {q(str(rootfs))} && pivot_root . . && umount -l . && cd /")
        if export is None:
            lines.append(f"exec env -i {env_words} sh -c {inner}")
        else:
            lines.append(f"rc=0; env -i {env_words} sh -c {inner} || rc=$?")
            lines.append(f"cp -a /usr/local/nvidia/. {q(str(export))}/")
            lines.append("exit $rc")
        return "\n".join(lines)


def _tripwire_dirs(env: dict[str, str]) -> list[Path]:
    """The dir of the session's tripwire note (tests/fixtures/pytest_plugin.py), bound in at
    its own path: a read the pod's installer makes of the machine's state is noted there."""
    note = env.get("NDI_KERNEL_LOG_TRIPWIRE")
    return [Path(note).parent] if note and Path(note).parent.is_dir() else []


@contextlib.contextmanager
def ubuntu_pod(work: Path, *, version: str = "550.54.14", release: str = UBUNTU_KERNEL,
               pod_class: type[Pod] = Pod, env: dict[str, str] | None = None):
    """A fixture Ubuntu node with a GPU, its fake kernel, the driver .run on a local HTTPS
    server, and a pod wired to them: what the demo and the benches install on.

    Yields (node, kernel, server, pod); the server stops on exit.
    """
    from tests.fixtures.kernel import FakeKernel
    from tests.fixtures.node import build_ubuntu_node
    from tests.fixtures.runfile import build_driver_run
    from tests.fixtures.server import ArtifactServer

    node = build_ubuntu_node(work / "node", kernel_release=release)
    kernel = FakeKernel(work / "kernel", release)
    kernel.add_gpu()
    run_file = build_driver_run(work / "runs", version)
    with ArtifactServer() as server:
        server.serve_run(version, run_file)
        pod = pod_on(node, kernel, server, work / "pod", pod_class=pod_class,
                     env={"NVIDIA_DRIVER_VERSION": version, **(env or {})})
        yield node, kernel, server, pod


def pod_on(node, kernel, server, scratch: Path, *, pod_class: type[Pod] = Pod,
           env: dict[str, str] | None = None, shared: tuple[Path, ...] = ()) -> Pod:
    """A pod on a fixture node and its FakeKernel that fetches drivers from ``server``'s
    /tesla (trusting its CA); ``shared`` dirs are bound in at their own paths too."""
    return pod_class(node_root=node.root, install_dir=node.install_dir, scratch=scratch,
                     fakebin=kernel.bin_dir, shared=[kernel.root, *shared],
                     env={**kernel.env(), "NVIDIA_DRIVER_BASE_URL": f"{server.url}/tesla",
                          "REQUESTS_CA_BUNDLE": str(server.ca_bundle_path), **(env or {})})


def reboot_then_cached_install(pod: Pod, kernel, server, env: dict[str, str] | None = None):
    """A reboot (no modules, no device nodes), then ``install``, which must be a cache hit.

    Returns the run and the requests ``server`` saw during it."""
    kernel.unload_all()
    before = len(server.requests)
    proc = ok(pod.run("install", env=env))
    assert last_event(proc)["plan"] == "cached", last_event(proc)
    return proc, server.requests[before:]


def events(stderr: str) -> list[dict]:
    """The JSON log events of a run (non-JSON lines are kept as {'raw': line})."""
    import json

    out = []
    for line in stderr.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"raw": line})
    return out


def last_event(proc) -> dict:
    """The last JSON event a finished run logged."""
    return [e for e in events(proc.stderr) if "event" in e][-1]


def ok(proc):
    """The run, once it is known to have succeeded (else its stderr's tail)."""
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc
