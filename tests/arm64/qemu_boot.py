"""Debian's arm64 kernel under qemu-system-aarch64 (TCG, no firmware: -kernel/-initrd),
booting the guest of tests/arm64/guest.py (issue 42 §3).

The image (``linux-image-<abi>`` arm64) comes from the same private apt configuration as
the headers (tests/arm64/provision.py), pinned to the headers' version; nothing is
installed on this machine but qemu-system-arm (``make deps-tiers``). The guest's /init
prints what the test reads between markers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.arm64.provision import ARCHES, CACHE_ROOT, COMPONENTS, CrossParts, default_log
from tests.debapt import Log, PrivateApt, run
from tests.vm.provision import locked

QEMU = "qemu-system-aarch64"
BOOT_TIMEOUT_S = 420  # TCG on 2 shared cores: measured in docs/arm64.md
def boot_parts(parts: CrossParts, log: Log = default_log) -> tuple[Path, Path, Path]:
    """(vmlinuz, busybox, /lib/modules/<abi>) for the headers' kernel, fetched once."""
    version = parts.versions[f"linux-headers-{parts.abi}:arm64"]
    out = CACHE_ROOT / "boot" / parts.abi
    vmlinuz, busybox = out / "vmlinuz", out / "busybox"
    modules = out / "root/lib/modules" / parts.abi
    with locked(CACHE_ROOT / ".lock"):
        if not (vmlinuz.is_file() and busybox.is_file() and modules.is_dir()):
            # provision()'s very sources: PrivateApt.configure forgets the lists whenever
            # the sources differ, and a cold cache then had no list to download from.
            apt = PrivateApt(CACHE_ROOT / "apt", log, COMPONENTS, architectures=ARCHES)
            apt.configure()
            if not apt.has_lists():
                apt.update()
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


def boot(vmlinuz: Path, initrd: Path, log_file: Path, *, memory_mib: int = 2048,
         timeout_s: float = BOOT_TIMEOUT_S, markers: tuple[str, str]) -> tuple[str, float]:
    """The console between the markers, and the boot's seconds (bounded)."""
    begin, end = markers
    argv = [QEMU, "-M", "virt", "-cpu", "cortex-a57", "-m", str(memory_mib), "-smp", "1",
            "-nographic", "-no-reboot", "-kernel", str(vmlinuz), "-initrd", str(initrd),
            "-append", "console=ttyAMA0 panic=-1 quiet loglevel=4"]
    t0 = time.monotonic()
    with open(log_file, "w") as f:
        subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                       timeout=timeout_s, check=False)
    took = time.monotonic() - t0
    text = log_file.read_text(errors="replace")
    if begin not in text or end not in text:
        raise AssertionError(f"no {begin!r}..{end!r} in the console:\n{text[-3000:]}")
    return text.split(begin, 1)[1].split(end, 1)[0], took
