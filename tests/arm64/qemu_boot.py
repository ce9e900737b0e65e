"""Debian's arm64 kernel under qemu-system-aarch64 (TCG, no firmware: -kernel/-initrd),
loading cross-built modules with busybox's insmod from an initramfs (issue 42 §3).

The image (``linux-image-<abi>`` arm64) and ``busybox-static`` (arm64) come from the same
private apt configuration as the headers (tests/arm64/provision.py), pinned to the
headers' version; nothing is installed on this machine but qemu-system-arm
(``make deps-tiers``). The initramfs' /init prints what the test reads between markers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.arm64.provision import CACHE_ROOT, CrossParts, default_log
from tests.debapt import Log, PrivateApt, run
from tests.vm.provision import locked

QEMU = "qemu-system-aarch64"
BOOT_TIMEOUT_S = 420  # TCG on 2 shared cores: measured in docs/arm64.md
BEGIN, END = "=== ndi-arm64 begin ===", "=== ndi-arm64 end ==="

# busybox sh: mount what insmod and dmesg read, load each module given, print the
# results between markers, power off (panic=-1 and -no-reboot end qemu either way).
INIT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "{BEGIN}"
echo "machine=$(uname -m) release=$(uname -r)"
for ko in $(cat /modules); do
  insmod /$ko; echo "insmod $ko rc=$?"
done
dmesg | grep -E 'NVRM|nvidia|Unknown symbol|disagrees|Invalid module|exec format'
echo "{END}"
poweroff -f
"""


def boot_parts(parts: CrossParts, log: Log = default_log) -> tuple[Path, Path, Path]:
    """(vmlinuz, busybox, /lib/modules/<abi>) for the headers' kernel, fetched once."""
    version = parts.versions[f"linux-headers-{parts.abi}:arm64"]
    out = CACHE_ROOT / "boot" / parts.abi
    vmlinuz, busybox = out / "vmlinuz", out / "busybox"
    modules = out / "root/lib/modules" / parts.abi
    with locked(CACHE_ROOT / ".lock"):
        if not (vmlinuz.is_file() and busybox.is_file() and modules.is_dir()):
            apt = PrivateApt(CACHE_ROOT / "apt", log, ["main", "contrib"],
                             architectures=("amd64", "arm64"))
            apt.configure()
            shutil.rmtree(out, ignore_errors=True)
            (out / "x").mkdir(parents=True)
            run(["apt-get", "-c", str(apt.conf), "download",
                 f"linux-image-{parts.abi}:arm64={version}", "busybox-static:arm64"],
                cwd=out, log=log)
            for deb in out.glob("*.deb"):
                run(["dpkg-deb", "-x", str(deb), str(out / "x")])
                deb.unlink()
            shutil.copy(out / "x" / f"boot/vmlinuz-{parts.abi}", out / "vmlinuz.tmp")
            shutil.copy(out / "x" / "bin/busybox", busybox)
            modules.parent.mkdir(parents=True)
            os.replace(out / "x" / "lib/modules" / parts.abi, modules)
            shutil.rmtree(out / "x")
            # The package has no modules.dep (its postinst runs depmod): made here, in the
            # cache's own tree (kmod's depmod reads the arm64 objects as they are).
            run(["depmod", "-b", str(out / "root"), parts.abi], log=log)
            os.replace(out / "vmlinuz.tmp", vmlinuz)  # last: its presence is the stamp
    return vmlinuz, busybox, modules


def in_tree_deps(modules: Path, names: list[str]) -> list[Path]:
    """The kernel's own modules that ``names`` (modinfo's ``depends``) need, dependencies
    first, from its modules.dep (``path: dep-path ...``, each dep's own deps listed too)."""
    deps: dict[str, list[str]] = {}
    for line in (modules / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[Path(path).name.split(".ko")[0].replace("-", "_")] = [path, *rest.split()]
    order: list[str] = []
    for name in names:
        path, *needs = deps[name.replace("-", "_")]
        for p in [*reversed(needs), path]:
            if p not in order:
                order.append(p)
    return [modules / p for p in order]


def initramfs(work: Path, busybox: Path, modules: list[Path]) -> Path:
    """busybox, /init and ``modules`` (loaded in this order; names must be unique)."""
    root = work / "initramfs"
    for d in ("bin", "proc", "sys", "dev"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy(busybox, root / "bin/busybox")
    (root / "init").write_text(INIT)
    (root / "init").chmod(0o755)
    for ko in modules:
        shutil.copy(ko, root / ko.name)
    (root / "modules").write_text(" ".join(ko.name for ko in modules) + "\n")
    image = work / "initramfs.cpio"
    files = subprocess.run(["find", "."], cwd=root, capture_output=True, text=True,
                           check=True).stdout
    with open(image, "wb") as f:
        subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root, input=files.encode(),
                       stdout=f, check=True)
    return image


def boot(vmlinuz: Path, initrd: Path, log_file: Path) -> tuple[str, float]:
    """The console between the markers, and the boot's seconds (bounded)."""
    argv = [QEMU, "-M", "virt", "-cpu", "cortex-a57", "-m", "2048", "-smp", "1",
            "-nographic", "-no-reboot", "-kernel", str(vmlinuz), "-initrd", str(initrd),
            "-append", "console=ttyAMA0 panic=-1 quiet loglevel=4"]
    t0 = time.monotonic()
    with open(log_file, "w") as f:
        subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                       timeout=BOOT_TIMEOUT_S, check=False)
    took = time.monotonic() - t0
    text = log_file.read_text(errors="replace")
    if BEGIN not in text or END not in text:
        raise AssertionError(f"no {BEGIN!r}..{END!r} in the console:\n{text[-3000:]}")
    return text.split(BEGIN, 1)[1].split(END, 1)[0], took
