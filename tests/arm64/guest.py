"""An arm64 Debian user space in which the installer itself runs, under
qemu-system-aarch64 (issue 42: "the installer loads them in an arm64 kernel").

The guest is one initramfs (no disk image, no debootstrap: its second stage would run
arm64 binaries on this machine):

- Debian's own arm64 packages, unpacked with ``dpkg-deb -x`` (no maintainer script runs):
  python3 (3.11, bookworm's), kmod (modprobe/insmod/rmmod/modinfo/depmod), busybox-static
  (the shell, mount), base-files (``/etc/os-release``: Debian 12) and what apt says they
  need, resolved for arm64 against an empty dpkg status by the tier's private apt config;
- the installer's Python dependencies as pip installs them for an aarch64 CPython 3.11
  (``--platform manylinux2014_aarch64``, wheels only: zstandard's is a C extension),
  as tests/vm does for x86_64's guest;
- this tree's ``installer/`` package, byte-compiled here when this machine's python3 is
  the guest's version (bytecode is the same on both architectures; an import under TCG
  costs ~10x);
- the kernel's own modules that the bundle's modules need (modules.dep), with depmod's
  files for them;
- the bundles and their ``index.json`` under ``/bundles``.

Cached by content under ``$NDI_ARM64_CACHE/guest`` (packages and wheels; the installer and
bundles are added per boot).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.arm64.provision import CACHE_ROOT, COMPONENTS, CrossParts, default_log
from tests.debapt import Log, PrivateApt, ProvisionError, run
from tests.realparts import cache
from tests.vm.harness import _entry_point
from tests.vm.provision import _python_deps, locked

REPO = Path(__file__).resolve().parents[2]
ROOT_PACKAGES = ("python3-minimal", "libpython3.11-stdlib", "kmod", "busybox-static",
                 "base-files")
GUEST_PYTHON = "3.11"
PLATFORMS = ["manylinux2014_aarch64", "linux_aarch64",
             *(f"manylinux_2_{n}_aarch64" for n in range(17, 37))]
DEPS_DIR = "opt/ndi/deps"
SITE_DIR = "opt/ndi/site"


def _closure(apt: PrivateApt) -> list[str]:
    """Every arm64 package ROOT_PACKAGES need, as apt resolves them for an empty system."""
    status = apt.root / "empty-status"
    status.write_text("")
    out = run(["apt-get", "-c", str(apt.conf), "-o", f"Dir::State::status={status}",
               "-o", "APT::Architecture=arm64", "-o", "APT::Install-Recommends=false",
               "-s", "install", *(f"{p}:arm64" for p in ROOT_PACKAGES)]).stdout
    # "Inst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [arm64])": arm64 or all
    names = [f"{m.group(1)}:{m.group(2)}"
             for m in re.finditer(r"^Inst (\S+) \(.*?\[(\w+)\]\)", out, re.M)]
    if not names:
        raise ProvisionError(f"apt resolved nothing for {ROOT_PACKAGES}:\n{out[-2000:]}")
    return names


def base_root(log: Log = default_log) -> Path:
    """The cached root of Debian packages and wheels (shared: copy before changing)."""
    apt = PrivateApt(CACHE_ROOT / "apt", log, COMPONENTS, architectures=("amd64", "arm64"))
    deps = _python_deps()
    with locked(CACHE_ROOT / ".lock"):
        apt.configure()
        names = _closure(apt)
        k = cache.key("arm64-guest", names, deps, PLATFORMS, cache.file_hash(Path(__file__)))
        done = CACHE_ROOT / "guest" / k / "root"
        if done.is_dir():
            return done
        work = done.parent.with_name(k + ".tmp")
        shutil.rmtree(work, ignore_errors=True)
        (work / "debs").mkdir(parents=True)
        log(f"arm64 guest: {len(names)} Debian packages, {len(deps)} Python dependencies")
        run(["apt-get", "-c", str(apt.conf), "download", *names], cwd=work / "debs", log=log)
        root = work / "root"
        for deb in sorted((work / "debs").glob("*.deb")):
            run(["dpkg-deb", "-x", str(deb), str(root)])
        shutil.rmtree(work / "debs")
        argv = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                "--no-compile", "--only-binary=:all:", "--implementation", "cp",
                "--python-version", GUEST_PYTHON, "--target", str(root / DEPS_DIR)]
        for plat in PLATFORMS:
            argv += ["--platform", plat]
        run(argv + deps, log=log)
        _compile(root / DEPS_DIR)
        os.replace(work, done.parent)
    return done


def _compile(tree: Path) -> None:
    """Bytecode for the guest's python3 (3.11 on both architectures) when this machine's
    is that version; otherwise the guest compiles as it imports."""
    py = "/usr/bin/python3"
    ver = subprocess.run([py, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True).stdout.strip()
    if ver == GUEST_PYTHON:
        subprocess.run([py, "-m", "compileall", "-q", "--invalidation-mode", "unchecked-hash",
                        str(tree)], check=True, capture_output=True)


def assemble(parts: CrossParts, modules: Path, bundles: Path, needs: list[str],
             dest: Path, init: str) -> Path:
    """The guest root at ``dest``: the cached base (hard links), this tree's installer,
    the in-tree modules ``needs`` pulls in (from the image's ``modules`` dir), the
    ``bundles`` dir and ``/init``."""
    from tests.arm64.qemu_boot import in_tree_deps

    subprocess.run(["cp", "-al", str(base_root()), str(dest)], check=True)
    site = dest / SITE_DIR
    shutil.copytree(REPO / "installer", site / "installer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    _compile(site)
    pth = dest / f"usr/local/lib/python{GUEST_PYTHON}/dist-packages/ndi.pth"
    pth.parent.mkdir(parents=True, exist_ok=True)
    pth.write_text(f"/{SITE_DIR}\n/{DEPS_DIR}\n")
    cli = dest / "usr/local/bin/nvidia-driver-installer"
    cli.parent.mkdir(parents=True, exist_ok=True)
    module, _, func = _entry_point().partition(":")  # as pyproject's script names it
    cli.write_text(f"#!/usr/bin/python3\nimport sys\nfrom {module} import {func}\n"
                   f"sys.argv[0] = 'nvidia-driver-installer'\nsys.exit({func}())\n")
    cli.chmod(0o755)
    target = dest / "lib/modules" / parts.abi
    for ko in in_tree_deps(modules, needs):
        rel = ko.relative_to(modules)
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ko, target / rel)
    for name in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        if (modules / name).is_file():
            shutil.copy(modules / name, target / name)
    run(["depmod", "-b", str(dest), parts.abi])
    shutil.copytree(bundles, dest / "bundles")
    (dest / "init").write_text(init)
    (dest / "init").chmod(0o755)
    return dest


def cpio(root: Path, image: Path) -> Path:
    files = subprocess.run(["find", "."], cwd=root, capture_output=True, text=True,
                           check=True).stdout
    with open(image, "wb") as f:
        subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root, input=files.encode(),
                       stdout=f, check=True)
    return image


BEGIN, END = "=== ndi-arm64 installer begin ===", "=== ndi-arm64 installer end ==="
INSTALL_DIR = "/home/kubernetes/bin/nvidia"


def install_init(installs: list[tuple[str, str, str]]) -> str:
    """busybox sh as /init: mounts, then for each (module type, driver version, .run name)
    a fresh install dir and ``install --prebuilt-only`` from ``/bundles``; its rc, its
    last JSON event, the NVRM lines it caused and /proc/modules between markers. kmod's
    tools come first on PATH (busybox's applets are linked into /bb only)."""
    lines = ["#!/bin/busybox sh", "/bin/busybox mkdir -p /bb", "/bin/busybox --install -s /bb",
             "export PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/bb",
             "mount -t proc proc /proc", "mount -t sysfs sysfs /sys",
             "mount -t devtmpfs devtmpfs /dev", "mkdir -p /tmp /run",
             "mount -t tmpfs tmpfs /tmp", "mount -t tmpfs tmpfs /run",
             f'echo "{BEGIN}"', 'echo "machine=$(uname -m) release=$(uname -r)"']
    for module_type, version, run_file in installs:
        lines += [
            f"rm -rf {INSTALL_DIR}; dmesg -c >/dev/null",
            f"nvidia-driver-installer install --host-root / --log-format json --skip-cuda-check "
            f"--driver-version {version} --driver-url file:///nonexistent/{run_file} "
            f"--kernel-module-type {module_type} --prebuilt-url file:///bundles/ "
            "--prebuilt-only >/tmp/out 2>&1",
            f'echo "install {module_type} rc=$?"',
            'grep \'"exit_code"\\|"event": "install_finished"\' /tmp/out | tail -n 1',
            "grep -c prebuilt_bundle_staged /tmp/out; grep -c nvidia_installer_started /tmp/out",
            "dmesg | grep -E 'NVRM|nvidia|Unknown symbol|disagrees|Invalid module|exec format'",
            "cat /proc/modules", f'echo "=== end {module_type}"']
    lines += [f'echo "{END}"', "poweroff -f"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(json.dumps({"root": str(base_root())}))
