"""Debian's real arm64 parts for a cross build on this amd64 machine (issue 42 §2).

With the arm64 architecture added to a private apt configuration only (tests/debapt.py,
``APT::Architectures``; /etc/apt and dpkg's own architectures untouched):

- ``nvidia-open-kernel-source`` for arm64 (contrib), and for amd64 to compare: Debian
  builds it per architecture (Architecture: amd64 arm64 ppc64el), so whether its
  sources are the same on both is checked, not assumed (``same_sources``);
- ``linux-headers-<abi>-arm64`` (arm64) and ``linux-headers-<X>-common`` (the source
  dir), named by the ``linux-headers-arm64`` metapackage's Depends;
- ``linux-kbuild-<X>`` for **amd64**: the output dir's ``scripts`` and ``tools`` link
  into ``/usr/lib/linux-kbuild-<X>``, whose fixdep/modpost run on the build machine.
  The arm64 package's would be aarch64 binaries.

Unpacked under ``$NDI_ARM64_CACHE`` (default /var/cache/ndi-arm64) at Debian's paths
under ``root/`` (the output dir's Makefile includes the common dir by its absolute path:
the jail binds each at that path). The cross compiler is the machine's own
(``gcc-aarch64-linux-gnu``, ``make deps-tiers``). Run by hand:
``python -m tests.arm64.provision``.
"""

from __future__ import annotations

import dataclasses
import filecmp
import json
import os
import re
import shutil
import time
from pathlib import Path

from tests.debapt import Log, PrivateApt, ProvisionError, run
from tests.vm import provision as vm_provision
from tests.vm.provision import locked

CACHE_ROOT = Path(os.environ.get("NDI_ARM64_CACHE", "/var/cache/ndi-arm64"))
COMPONENTS = ["main", "contrib", "non-free"]
ARCHES = ("amd64", "arm64")
TREES = ("open-arm64", "open-amd64", "prop-arm64")  # unpacked kernel module trees
RECIPE_VERSION = "3"


@dataclasses.dataclass(frozen=True)
class CrossParts:
    abi: str  # 6.1.0-56-arm64: the arm64 kernel's release
    root: Path  # the Debian paths below are under it
    source: str  # /usr/src/linux-headers-<X>-common (as Debian installs it)
    output: str  # /usr/src/linux-headers-<abi>
    kbuild: str  # /usr/lib/linux-kbuild-<X> (amd64 tools)
    open_tree: Path  # the arm64 package's kernel-open tree (Kbuild at its top)
    open_tree_amd64: Path
    proprietary_tree: Path  # nvidia-kernel-source (arm64): NVIDIA's kernel/ tree
    userspace: Path  # the arm64 nvidia-smi, libnvidia-ml.so.<V>, nvidia-modprobe unpacked
    versions: dict[str, str]  # package -> Debian version

    def binds(self) -> list[tuple[str, str]]:
        """(cache path, jail path): the three dirs at the paths Debian installs them."""
        return [(str(self.root / d.lstrip("/")), d) for d in (self.source, self.output, self.kbuild)]


def default_log(msg: str) -> None:
    print(f"[arm64] {msg}", flush=True)


def _show(apt: PrivateApt, pkg: str, field: str) -> str:
    text = run(["apt-cache", "-c", str(apt.conf), "show", "--no-all-versions", pkg]).stdout
    m = re.search(rf"^{field}: (.+)$", text, re.M)
    if not m:
        raise ProvisionError(f"apt-cache show {pkg} has no {field}")
    return m.group(1)


def _release_version(apt: PrivateApt, pkg: str) -> str:
    """``pkg``'s version in the release suite itself (bookworm), not its -security or
    -updates: Debian's 535.261.03 open modules do not build against bookworm-security's
    6.1.192 (``pci_resize_resource`` gained an ``exclude_bars`` argument there: nv-pci.c:223
    "too few arguments"; the realparts tier's amd64 build of 535 fails the same way), and
    do against the point release's 6.1.176."""
    suite = vm_provision._host_codename()
    out = run(["apt-cache", "-c", str(apt.conf), "madison", pkg]).stdout
    for line in out.splitlines():
        parts = [x.strip() for x in line.split("|")]
        if len(parts) == 3 and parts[2].split()[1].split("/")[0] == suite:
            return parts[1]
    raise ProvisionError(f"no {pkg} in {suite} itself: {out.strip()[:300]}")


def _names(apt: PrivateApt) -> dict[str, str]:
    """package (with :arch and =version) -> the directory it is unpacked into."""
    version = _release_version(apt, "linux-headers-arm64:arm64")
    dep = _show(apt, f"linux-headers-arm64:arm64={version}", "Depends")
    m = re.match(r"linux-headers-(\d+\.\d+)\.0-(\d+)-arm64", dep)
    if not m:
        raise ProvisionError(f"linux-headers-arm64 depends on {dep!r}, not linux-headers-<abi>-arm64")
    series, abi_n = m.groups()
    base = f"{series}.0-{abi_n}"
    return {"nvidia-open-kernel-source:arm64": "open-arm64",
            "nvidia-open-kernel-source:amd64": "open-amd64",
            "nvidia-kernel-source:arm64": "prop-arm64",
            # NVIDIA's arm64 user space for the test .run's payload (the stand-in
            # nvidia-installer installs them; nothing runs them on this machine).
            "nvidia-smi:arm64": "user-arm64", "libnvidia-ml1:arm64": "user-arm64",
            "nvidia-modprobe:arm64": "user-arm64",
            f"linux-headers-{base}-arm64:arm64={version}": "root",
            f"linux-headers-{base}-common:all={version}": "root",
            f"linux-kbuild-{series}:amd64={version}": "root"}


def _resolve(apt: PrivateApt) -> tuple[dict[str, str], dict[str, str]]:
    """_names and each package's candidate version, remembered per state of the package
    lists (each apt-cache call reads both architectures' lists: seconds)."""
    lists = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns)
                   for p in (apt.root / "lists").iterdir() if p.is_file())
    state = json.dumps([RECIPE_VERSION, lists])
    memo = apt.root / "resolved.json"
    try:
        saved = json.loads(memo.read_text())
        if saved["state"] == state:
            return saved["names"], saved["versions"]
    except (OSError, ValueError, KeyError):
        pass
    names = _names(apt)
    versions = {p.split("=")[0]: _show(apt, p, "Version") for p in names}
    memo.write_text(json.dumps({"state": state, "names": names, "versions": versions}))
    return names, versions


def _download(apt: PrivateApt, pkg: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.deb"):
        old.unlink()
    run(["apt-get", "-c", str(apt.conf), "download", pkg], cwd=dest, log=apt.log)
    (deb,) = dest.glob("*.deb")
    return deb


def _unpack_open(pkg_dir: Path) -> Path:
    """The package's usr/src/*.tar.xz unpacked beside it; its kernel-open tree."""
    for tarball in sorted(pkg_dir.glob("usr/src/*.tar.xz")):
        run(["tar", "-xJf", str(tarball), "-C", str(pkg_dir)])
        tarball.unlink()
    found = sorted(p.parent for p in pkg_dir.rglob("Kbuild") if (p.parent / "nvidia").is_dir())
    if not found:
        raise ProvisionError(f"no kernel module tree (Kbuild beside nvidia/) in {pkg_dir}")
    return found[0]


def provision(log: Log = default_log) -> CrossParts:
    """Download (once) and unpack the arm64 parts; where they are."""
    t0 = time.monotonic()
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with locked(CACHE_ROOT / ".lock"):
        apt = PrivateApt(CACHE_ROOT / "apt", log, COMPONENTS, architectures=ARCHES)
        apt.configure()
        if not apt.has_lists() or os.environ.get("NDI_ARM64_REFRESH") == "1":
            apt.update()
        names, versions = _resolve(apt)
        stamp = CACHE_ROOT / "parts.json"
        record = {"recipe": RECIPE_VERSION, "versions": versions}
        if not stamp.exists() or json.loads(stamp.read_text())["versions"] != versions:
            stamp.unlink(missing_ok=True)
            for d in ("root", *TREES, "user-arm64"):
                shutil.rmtree(CACHE_ROOT / d, ignore_errors=True)
            for pkg, into in names.items():
                deb = _download(apt, pkg, CACHE_ROOT / "debs" / pkg.split("=")[0].replace(":", "_"))
                run(["dpkg-deb", "-x", str(deb), str(CACHE_ROOT / into)], log=log)
            trees = {d: str(_unpack_open(CACHE_ROOT / d)) for d in TREES}
            stamp.write_text(json.dumps({**record, "trees": trees}, indent=1) + "\n")
        saved = json.loads(stamp.read_text())
    base = next(p for p in versions if p.endswith("-common:all")).split(":")[0]
    abi = next(p for p in versions if p.endswith("-arm64:arm64") and "headers" in p)
    series = next(p for p in versions if p.startswith("linux-kbuild-")).split(":")[0]
    parts = CrossParts(
        abi=abi.split(":")[0].removeprefix("linux-headers-"), root=CACHE_ROOT / "root",
        source=f"/usr/src/{base}", output=f"/usr/src/{abi.split(':')[0]}",
        kbuild=f"/usr/lib/{series}", open_tree=Path(saved["trees"]["open-arm64"]),
        open_tree_amd64=Path(saved["trees"]["open-amd64"]),
        proprietary_tree=Path(saved["trees"]["prop-arm64"]), userspace=CACHE_ROOT / "user-arm64",
        versions=versions)
    for d in (parts.source, parts.output):
        if not (parts.root / d.lstrip("/") / "Makefile").is_file():
            raise ProvisionError(f"{d} has no Makefile under {parts.root}")
    log(f"ready: {parts.abi}, open modules {versions['nvidia-open-kernel-source:arm64']} "
        f"in {time.monotonic() - t0:.1f} s")
    return parts


def differing_sources(a: Path, b: Path) -> list[str]:
    """Files that differ between two kernel-open trees (relative paths), or exist in one."""
    out: list[str] = []

    def walk(cmp: filecmp.dircmp, rel: str) -> None:
        out.extend(f"{rel}{n}" for n in (*cmp.left_only, *cmp.right_only, *cmp.diff_files,
                                         *cmp.funny_files))
        for name, sub in sorted(cmp.subdirs.items()):
            walk(sub, f"{rel}{name}/")

    walk(filecmp.dircmp(a, b), "")
    return sorted(out)


if __name__ == "__main__":
    p = provision()
    print(json.dumps({**dataclasses.asdict(p), "root": str(p.root),
                      "open_tree": str(p.open_tree),
                      "open_tree_amd64": str(p.open_tree_amd64),
                      "proprietary_tree": str(p.proprietary_tree),
                      "userspace": str(p.userspace)}, indent=1))
