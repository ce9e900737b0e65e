"""The attack suite's fixture nodes: every test runs the CLI as the pod does, attacks one input,
and checks the exit code, the one-line final message, and that nothing changed on the host
outside the install dir (and what the contract lets an install write there).

``canary`` is a directory bound into the pod at its own path, outside the host root: a
host symlink aimed at it (``/run -> <canary>/run``) means ``<host-root><canary>/run`` on the
node, so anything that lands in the canary itself was written outside the host root.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cosbucket import Bucket
from tests.fixtures.kernel import FakeKernel
from tests.fixtures.node import COS_KERNEL, UBUNTU_KERNEL, Node, build_cos_node, build_ubuntu_node
from tests.fixtures.runfile import LABEL, driver_payload, nvidia_header, run_name
from tests.fixtures.server import ArtifactServer
from tests.pod import Pod, events, pod_on

V = "550.54.14"  # the Ubuntu flow's version here; COS: gpu_latest_version
V_OLD = "535.183.01"  # COS: gpu_default_version
RUN = f"NVIDIA-Linux-x86_64-{V}.run"
INSTALL_HOST = "/home/kubernetes/bin/nvidia"
TOOLS = "var/lib/cos-tools/"
# What docs/contract.md §4 lets a successful install write on the host, outside the install dir.
CONTRACT_WRITES = ("etc/ld.so.conf", "etc/ld.so.conf.d/nvidia.conf", "etc/ld.so.cache",
                   "run/nvidia/validations/driver-ready", "tmp/cos_gpu_installer_lock",
                   "var/lib/cos-tools/", "lib/firmware/updates/")


def tree(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Every entry under ``root`` (not following links): type, mode and content digest."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if skip is not None and here == skip:
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            p = here / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "link:" + os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                out[rel] = f"file:{st.st_mode:o}:" + hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = f"{stat.S_IFMT(st.st_mode):o}:{st.st_mode:o}"
    return out


def doctored_run(out: Path, *, header: str = "", installer: str = "", makefile: str = "",
                 files: dict[str, str] | None = None) -> Path:
    """The stock .run (version ``V``) with hostile code: ``header`` shell lines run first
    in its makeself header (a here-document to makeself: no $ or quotes of their own),
    ``installer`` lines replace nvidia-installer (the real one is
    ``.nvidia-installer-real`` beside it), ``makefile`` is a recipe line run first by
    each kernel Makefile's ``modules``, ``files`` are added to the payload."""
    payload = out / f"payload-{V}"
    shutil.copytree(driver_payload(V), payload, symlinks=True)
    for name, text in (files or {}).items():
        (payload / name).write_text(text)
    if installer:
        script = payload / "nvidia-installer"
        script.rename(payload / ".nvidia-installer-real")
        script.write_text(f"#!/bin/sh\n{installer}\n")
        script.chmod(0o755)
    for tree in ("kernel", "kernel-open") if makefile else ():
        mk = payload / tree / "Makefile"
        mk.write_text(mk.read_text().replace("modules:\n", f"modules:\n\t{makefile}\n", 1))
    stock = nvidia_header()
    doctored = stock.replace("#!/bin/sh\n", f"#!/bin/sh\n{header}\n", 1) if header else stock
    assert doctored != stock or not header
    header_file = out / "doctored-header.sh"
    header_file.write_text(doctored)
    run = out / run_name(V)
    subprocess.run(["makeself", "--header", str(header_file), "--nox11", "--keep-umask",
                    "--sha256", str(payload), str(run), f"{LABEL} {V}", "./nvidia-installer"],
                   check=True, capture_output=True, text=True)
    return run


@dataclass
class World:
    """A fixture node with its kernel, artifact server and pod, plus the canary."""

    node: Node
    kernel: FakeKernel
    server: ArtifactServer
    pod: Pod
    canary: Path
    bucket: Bucket | None = None
    before: dict[str, str] = field(default_factory=dict)

    def snapshot(self) -> None:
        """The host as it is now: what ``host_changes`` compares against."""
        self.before = tree(self.node.root, skip=self.node.install_dir)

    def run(self, *args: str, env: dict[str, str] | None = None, **kw):
        """Run the CLI in the pod (the COS bucket is written, unless a test wrote and changed
        it first, and served at the first run)."""
        if self.bucket is not None and "COS_DOWNLOAD_GCS" not in self.pod.env:
            if not self.bucket.build_dir.exists():
                self.bucket.write()
            self.pod.env["COS_DOWNLOAD_GCS"] = self.bucket.serve(self.server)
        if not self.before:
            self.snapshot()
        return self.pod.run(*args, env=env, **kw)

    def host_changes(self) -> set[str]:
        after = tree(self.node.root, skip=self.node.install_dir)
        return {k for k in set(self.before) | set(after) if self.before.get(k) != after.get(k)}

    def assert_host_unchanged(self, *, installed: bool = False, also: tuple[str, ...] = (),
                              ) -> None:
        """Nothing outside the install dir changed (on success: only the contract's paths,
        and ``also``: host paths a test redirected them to), and nothing at all was written
        outside the host root (the canary)."""
        changed = self.host_changes()
        if installed:
            allowed = CONTRACT_WRITES + tuple(a.strip("/") + "/" for a in also)
            changed = {c for c in changed if not any(
                c == w.rstrip("/") or c.startswith(w) or w.startswith(c + "/") for w in allowed)}
        else:
            changed -= {"tmp/cos_gpu_installer_lock"}  # the lock may be created, never more
            # The COS tools cache's own (empty) dirs; any file left in it still counts.
            changed -= {c for c in changed if self.node.path("/" + c).is_dir() and (
                TOOLS.startswith(c + "/") or c.startswith(TOOLS))}
        assert changed == set(), f"the host changed outside the install dir: {sorted(changed)}"
        assert sorted(p.name for p in self.canary.iterdir()) == ["sentinel"], \
            f"written outside the host root: {sorted(map(str, self.canary.rglob('*')))}"
        assert (self.canary / "sentinel").read_text() == "untouched\n"


def final(proc) -> dict:
    """The run's last event, whose message is one line."""
    evs = [e for e in events(proc.stderr) if "event" in e]
    assert evs, proc.stderr[-3000:]
    last = evs[-1]
    assert "\n" not in last.get("message", ""), last
    return last


def outcome(proc, code: int, *words: str) -> dict:
    """Exit ``code`` and a final message naming ``words`` (case-insensitive)."""
    assert proc.returncode == code, proc.stderr[-4000:]
    last = final(proc)
    for word in words:
        assert word.lower() in last["message"].lower(), (word, last["message"])
    return last


def event_names(proc) -> list[str]:
    return [e["event"] for e in events(proc.stderr) if "event" in e]


@pytest.fixture
def canary(tmp_path):
    d = tmp_path / "canary"
    d.mkdir()
    (d / "sentinel").write_text("untouched\n")
    return d


@contextlib.contextmanager
def _world(tmp_path, canary, driver_run, node, env):
    """A node with a GPU, the driver .runs on a local HTTPS server, and a pod whose
    container also sees the canary dir (outside the host root)."""
    kernel = FakeKernel(tmp_path / "kernel", node.kernel_release)
    kernel.add_gpu()
    with ArtifactServer() as server:
        for version in (V, V_OLD):
            server.serve_run(version, driver_run.path(version))
        yield node, kernel, server, pod_on(node, kernel, server, tmp_path / "pod", env=env,
                                           shared=(canary,))


@pytest.fixture
def ubuntu(tmp_path, canary, driver_run):
    node = build_ubuntu_node(tmp_path / "node", kernel_release=UBUNTU_KERNEL)
    with _world(tmp_path, canary, driver_run, node, {"NVIDIA_DRIVER_VERSION": V}) as parts:
        yield World(*parts, canary)


@pytest.fixture
def cos(tmp_path, canary, driver_run):
    """A COS node whose build serves everything (the bucket is written at the first run, so a
    test may change it first)."""
    node = build_cos_node(tmp_path / "node", kernel_release=COS_KERNEL)
    with _world(tmp_path, canary, driver_run, node, {}) as parts:
        yield World(*parts, canary, Bucket(tmp_path / "bucket"))
