"""Debian's 6.12 kernel for NVIDIA's 550 parts (issue 21): image, headers and kbuild,
unpacked into the cache (this machine's /usr and /lib/modules are never written).

Which 6.12: bookworm-backports' build. Trixie's own 6.12 cannot be built against on a
Debian 12 machine: its ``linux-headers-<abi>`` Depends on gcc-14 (its .config says
``CONFIG_CC_VERSION_TEXT="gcc-14 ..."``, which NVIDIA's Makefile turns into ``CC``) and
its ``linux-kbuild`` tools need libc6 >= 2.38 (bookworm has 2.36). The backport is the
same 6.12 series built with bookworm's gcc-12 and glibc: the installer builds against it
with the tools this machine (and our Ubuntu/Debian images) has.

Layout: ``$NDI_REALPARTS_CACHE/kernels/<abi>/root/`` holds ``usr/src/linux-headers-<X>-common``
(the source dir), ``usr/src/linux-headers-<abi>`` (the output dir) and
``usr/lib/linux-kbuild-<X>``, at the paths Debian installs them (the output dir's
Makefile and ``scripts`` link name them); ``image.deb`` is linux-image-<abi> for the
qemu tier (tests/vm/provision.py ``provision_extra_kernel``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

from tests.debapt import PrivateApt, ProvisionError, deb_name, run, upstream, version_key
from tests.realparts import provision as parts_provision
from tests.realparts.kbuild import Headers
from tests.realparts.provision import CACHE_ROOT, default_log
from tests.vm.provision import locked

SUITE = "bookworm-backports"
SERIES = "6.12."
RECIPE_VERSION = "1"


@dataclasses.dataclass(frozen=True)
class NewerKernel:
    headers: Headers  # paths under root; headers.root = root
    image_deb: Path  # linux-image-<abi>


def _pick(apt: PrivateApt) -> tuple[str, str]:
    """(abi, Debian version) of the newest 6.12 in the suite, read from linux-image-amd64's
    Depends (the metapackage names the ABI Debian builds for)."""
    found = [v for v, src in apt.madison(["linux-image-amd64"])["linux-image-amd64"]
             if parts_provision.in_suites(src, (SUITE,)) and upstream(v).startswith(SERIES)]
    if not found:
        raise ProvisionError(f"{SUITE} has no linux-image-amd64 of the {SERIES}x series")
    version = max(found, key=lambda v: version_key(upstream(v)))
    shown = run(["apt-cache", "-c", str(apt.conf), "show", f"linux-image-amd64={version}"]).stdout
    m = re.search(r"^Depends:.*?linux-image-(\S+-amd64)\b", shown, re.M)
    if not m:
        raise ProvisionError(f"linux-image-amd64={version} names no linux-image-<abi>")
    return m.group(1), version


def newer_kernel(log=default_log) -> NewerKernel:
    """Fetch (once) and unpack the 6.12 kernel's image, headers and kbuild."""
    parts_provision._check_machine()
    with locked(CACHE_ROOT / ".lock"):
        apt = PrivateApt(CACHE_ROOT / "apt", log, parts_provision.COMPONENTS,
                         parts_provision.EXTRA_SUITES)
        apt.configure()
        if not apt.has_lists():
            apt.update()
        try:
            abi, version = _pick(apt)
        except ProvisionError:
            apt.update()
            abi, version = _pick(apt)
        base = abi.removesuffix("-amd64")
        pins = {f"linux-image-{abi}": version, f"linux-headers-{abi}": version,
                f"linux-headers-{base}-common": version, f"linux-kbuild-{base}": version}
        kdir = CACHE_ROOT / "kernels" / abi
        root = kdir / "root"
        stamp = kdir / "kernel.json"
        record = {"recipe": RECIPE_VERSION, "pins": pins}
        if not stamp.exists() or json.loads(stamp.read_text()) != record:
            debs = CACHE_ROOT / "debs"
            debs.mkdir(parents=True, exist_ok=True)
            missing = {p: v for p, v in pins.items() if not (debs / deb_name(p, v)).exists()}
            if missing:
                apt.download(missing, debs)
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            for pkg in pins:
                if not pkg.startswith("linux-image-"):
                    run(["dpkg-deb", "-x", str(debs / deb_name(pkg, version)), str(root)], log=log)
            image = kdir / "image.deb"
            image.unlink(missing_ok=True)
            os.link(debs / deb_name(f"linux-image-{abi}", version), image)
            tmp = stamp.with_suffix(".tmp")
            tmp.write_text(json.dumps(record, indent=1) + "\n")
            os.replace(tmp, stamp)  # written last: its presence says the rest is there
    output = root / f"usr/src/linux-headers-{abi}"
    source = root / f"usr/src/linux-headers-{base}-common"
    for tree in (output, source):
        if not (tree / "Makefile").is_file():
            raise ProvisionError(f"{tree} has no Makefile after unpacking {pins}")
    headers = Headers(abi=abi, source=source, output=output,
                      packages={p: v for p, v in pins.items() if p.startswith("linux-headers-")},
                      root=root)
    return NewerKernel(headers=headers, image_deb=kdir / "image.deb")


if __name__ == "__main__":
    k = newer_kernel()
    print(json.dumps({"abi": k.headers.abi, "source": str(k.headers.source),
                      "output": str(k.headers.output), "image": str(k.image_deb)}, indent=1))
