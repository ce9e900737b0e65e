"""NVIDIA's real kernel modules built by the installer itself, as the pod runs it.

``install_real`` runs ``nvidia-driver-installer install`` in the pod-like chroot
(tests/pod.py: a container rootfs that is an overlay of this machine's /, whose
own /dev is an empty directory as in a registry image) on a fixture Debian node
whose kernel headers are this machine's real, split ones (hard-linked into the
node), against a fake kernel with a T4 GPU. The .run holds NVIDIA's real module
trees and firmware; its user space is the fixture's, which drives the fake
kernel (a real nvidia-smi needs a GPU). Everything NVIDIA's kbuild compiles
goes through our sandbox.

The resulting install dir (real nvidia.ko & co. built for the qemu tier's
kernel, firmware, .cache) is cached by the inputs: the .run, the headers'
package versions, the module type and the installer's files that decide what the build
produces (shaping.py: not the whole installer/, so a change elsewhere reuses the builds).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.fixtures import node as node_module
from tests.fixtures.kernel import FakeKernel
from tests.fixtures.node import DEBIAN_12, build_ubuntu_node
from tests.fixtures.server import ArtifactServer
from tests.pod import Pod, events
from tests.realparts import cache, shaping
from tests.realparts.kbuild import Headers
from tests.realparts.provision import default_log

T4 = "0x1eb8"  # Turing: R470 and R535, proprietary and open modules
INSTALL_TIMEOUT_S = 1800


@dataclasses.dataclass(frozen=True)
class RealInstall:
    install_dir: Path  # bin/ lib64/ drivers/ firmware/ .cache nvidia-installer.log kernel-build.log
    events: list[dict]  # the run's JSON log events
    seconds: float
    rc: int

    @property
    def installer_log(self) -> str:
        return (self.install_dir / "nvidia-installer.log").read_text(errors="replace")

    @property
    def build_log(self) -> str:
        """make's output of NVIDIA's Makefile (the installer keeps it as kernel-build.log)."""
        return (self.install_dir / "kernel-build.log").read_text(errors="replace")

    def event(self, name: str) -> dict:
        found = [e for e in self.events if e.get("event") == name]
        assert found, f"no {name} event"
        return found[-1]


def _link_headers(headers: Headers, node_root: Path) -> None:
    """The real headers inside the node, as Debian lays them out (hard links: cheap)."""
    kbuild = (headers.output / "scripts").resolve().parent  # /usr/lib/linux-kbuild-<v>
    for tree in (headers.output, headers.source, kbuild):
        dest = node_root / tree.relative_to(headers.root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-al", str(tree), str(dest)], check=True)
    modules = node_root / "lib/modules" / headers.abi
    modules.mkdir(parents=True, exist_ok=True)
    for name, target in (("build", headers.output), ("source", headers.source)):
        (modules / name).unlink(missing_ok=True)
        # absolute, as Debian ships them
        os.symlink(Path("/") / target.relative_to(headers.root), modules / name)


def install_real(run: Path, version: str, module_type: str, headers: Headers, *,
                 expect_ok: bool = True, log=default_log) -> RealInstall:
    """Install ``run`` on a fresh fixture node through the pod; cached by inputs.

    ``expect_ok=False``: a failing install is a result too (its exit code and events)."""
    k = cache.key("through-installer", cache.file_hash(run), headers.packages, module_type,
                  shaping.source_hash(), cache.file_hash(Path(__file__)),
                  cache.file_hash(Path(node_module.__file__)))

    def produce(work: Path) -> None:
        scratch = work / "scratch"
        node = build_ubuntu_node(scratch / "node", kernel_release=headers.abi, headers=False,
                                 os_release=DEBIAN_12)
        _link_headers(headers, node.root)
        kernel = FakeKernel(scratch / "kernel", headers.abi)
        kernel.add_gpu(device=T4)
        log(f"installing {run.name} ({module_type}) through the installer's sandbox "
            "(a real NVIDIA build: minutes)")
        t0 = time.monotonic()
        with ArtifactServer() as server:
            server.serve(f"/tesla/{version}/{run.name}", run)
            pod = Pod(node_root=node.root, install_dir=node.install_dir, scratch=scratch / "pod",
                      fakebin=kernel.bin_dir, shared=[kernel.root],
                      env={**kernel.env(), "NVIDIA_DRIVER_VERSION": version,
                           "NVIDIA_KERNEL_MODULE_TYPE": module_type,
                           "NVIDIA_DRIVER_BASE_URL": f"{server.url}/tesla",
                           "REQUESTS_CA_BUNDLE": str(server.ca_bundle_path),
                           # No GPU for CUDA, and the trimmed .run has no libcuda: the check
                           # is proven by tests/integration/test_cuda_check.py and tests/gpu.
                           "NVIDIA_SKIP_CUDA_CHECK": "1"})
            proc = pod.run("install", timeout=INSTALL_TIMEOUT_S)
        seconds = round(time.monotonic() - t0, 1)
        log(f"install exited {proc.returncode} after {seconds} s")
        if proc.returncode < 0:  # killed (the run was stopped): not a result to cache
            raise RuntimeError(f"install of {run.name} was killed by signal {-proc.returncode}")
        if proc.returncode != 0 and expect_ok:
            raise AssertionError(f"install of {run.name} ({module_type}) through the pod "
                                 f"failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
        shutil.copytree(node.install_dir, work / "install", symlinks=True)
        (work / "events.json").write_text(json.dumps(
            {"seconds": seconds, "rc": proc.returncode, "events": events(proc.stderr)}))
        shutil.rmtree(scratch)

    done = cache.cached_dir("through-installer", k, produce)
    record = json.loads((done / "events.json").read_text())
    return RealInstall(done / "install", record["events"], record["seconds"], record["rc"])
