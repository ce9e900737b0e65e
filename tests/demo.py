"""`make demo`: a real install on a built-in fixture node, the way the pod runs it.

Builds a fake Ubuntu node (os-release, kernel headers, ld.so.conf), a fake
kernel (procfs/sysfs/dev stand-ins and kmod tools), a makeself NVIDIA .run and
a local HTTPS artifact server with a private CA; then runs
`nvidia-driver-installer install` inside a private mount namespace and chroot
whose /root is the node (as the DaemonSet's init container sees it): a fresh
install, a "reboot" that loads from the cache, then an upgrade to a version the
server does not have and `doctor` after it. Nothing outside a temp dir changes.
Needs root (mount namespaces); says so if not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from installer.base.branches import RECOMMENDED_VERSION
from tests.fixtures.kernel import UBUNTU_KERNEL
from tests.pod import ubuntu_pod

RELEASE = UBUNTU_KERNEL
VERSION = RECOMMENDED_VERSION  # the R580 default, as a node gets it


def banner(text: str) -> None:
    print(f"\n\033[1m=== {text}\033[0m" if sys.stdout.isatty() else f"\n=== {text}", flush=True)


def require_namespaces() -> None:
    if os.geteuid() != 0:
        sys.exit("make demo needs root: it mounts an overlay and a chroot in a private mount "
                 "namespace. Re-run with sudo, or as: unshare --user --map-root-user make demo")
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        sys.exit(f"the kernel refused a mount namespace ({probe.stderr.strip()}); "
                 "the demo needs CAP_SYS_ADMIN (run as root on a VM, not in an unprivileged container)")


def main() -> int:
    require_namespaces()
    work = Path(tempfile.mkdtemp(prefix="ndi-demo-", dir="/tmp"))
    try:
        banner(f"fixture node (Ubuntu 22.04, kernel {RELEASE}) in {work}/node")
        with ubuntu_pod(work, version=VERSION, release=RELEASE,
                        env={"LOG_FORMAT": "console"}) as (node, kernel, server, pod):
            print(f"artifact server: {server.url}/tesla/{VERSION}/")
            banner("install (fresh): detect -> download -> build -> load -> ld cache -> verify")
            first = pod.run("install")
            print(first.stderr, end="")
            if first.returncode != 0:
                print(f"install failed with exit code {first.returncode}")
                return first.returncode
            banner("the install dir the host sees at /home/kubernetes/bin/nvidia")
            for path in sorted(node.install_dir.rglob("*")):
                rel = path.relative_to(node.install_dir)
                if rel.parts[0] in ("bin", "lib64", "drivers") or rel.name in (".cache", "status.json"):
                    print(f"  {rel}" + (f" -> {os.readlink(path)}" if path.is_symlink() else ""))
            print("\n.cache:\n" + (node.install_dir / ".cache").read_text())
            banner("reboot: modules unloaded; the next run loads from the cache, no download")
            kernel.unload_all()
            second = pod.run("install")
            print(second.stderr, end="")
            if second.returncode != 0:
                return second.returncode
            missing = "580.99.99"
            banner(f"upgrade to {missing}, which the server does not have (exit 5; final line)")
            third = pod.run("install", env={"NVIDIA_DRIVER_VERSION": missing})
            print(third.stderr.rstrip().splitlines()[-1])
            banner("doctor: the old driver still works; what failed and what to do")
            print(pod.run("doctor").stdout, end="")
            return 0 if third.returncode == 5 else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
