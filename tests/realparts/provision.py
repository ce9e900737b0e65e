"""Fetch NVIDIA's real driver parts from Debian's archive, unpacked and cached.

Debian ships NVIDIA's kernel module trees (Kbuild, Makefile, conftest.sh and
the ``nv-kernel.o_binary`` blobs), the GSP firmware, ``nvidia-smi``,
``libnvidia-ml`` and ``nvidia-modprobe`` in the components ``contrib``,
``non-free`` and ``non-free-firmware``, which this machine's apt config does
not enable: apt runs with a private configuration (tests/debapt.py).

Cache layout under ``$NDI_REALPARTS_CACHE`` (default /var/cache/ndi-realparts)::

    apt/                 apt.conf, sources.list, lists/, cache/ (private apt state)
    debs/<pkg>_<ver>.deb the downloaded packages
    parts/<key>/         dpkg-deb -x of each package, kernel trees in trees/
    parts/<key>.json     the result (paths, versions, origins); written last,
                         so its presence is the stamp

``<key>`` hashes the chosen package versions. A warm run reads the local
package lists (no network) and finds the stamp: well under a second. Set
``NDI_REALPARTS_REFRESH=1`` to re-read the archive's package lists.

Run by hand: ``python -m tests.realparts.provision`` (prints the parts as JSON).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from tests.debapt import (  # noqa: F401 (ProvisionError, run: this module's API too)
    Log,
    PrivateApt,
    ProvisionError,
    deb_name,
    run,
    upstream,
    version_key,
)
from tests.vm.provision import locked

CACHE_ROOT = Path(os.environ.get("NDI_REALPARTS_CACHE", "/var/cache/ndi-realparts"))

# nvidia-open-kernel-source and nvidia-modprobe are in contrib (free software
# that needs non-free parts to be useful); the rest is in non-free and
# non-free-firmware.
COMPONENTS = ["main", "contrib", "non-free", "non-free-firmware"]

# Debian's "current" driver (535 on bookworm): every package of one upstream version.
MAIN_PACKAGES = {
    "kernel": "nvidia-kernel-source",
    "kernel_open": "nvidia-open-kernel-source",
    "firmware_dir": "firmware-nvidia-gsp",
    "nvidia_smi": "nvidia-smi",
    "libnvidia_ml": "libnvidia-ml1",
}
# The 470 branch: the proprietary tree (470 has no open modules, no GSP firmware);
# its nvidia-smi and libnvidia-ml are taken when Debian has them at the same version.
LEGACY_PACKAGES = {
    "kernel": "nvidia-tesla-470-kernel-source",
    "nvidia_smi": "nvidia-tesla-470-smi",
    "libnvidia_ml": "libnvidia-tesla-470-ml1",
}
LEGACY_REQUIRED = ("kernel",)
MODPROBE_PACKAGE = "nvidia-modprobe"  # its own release train: newest <= the main version

RECIPE_VERSION = "1"


@dataclasses.dataclass(frozen=True)
class DriverParts:
    """One driver version's real parts. Paths point into the shared cache: never write there."""

    version: str
    kernel: Path | None  # NVIDIA's proprietary module tree (the .run's kernel/)
    kernel_open: Path | None  # the open module tree (kernel-open/)
    firmware_dir: Path | None  # gsp_*.bin (the .run's firmware/)
    nvidia_smi: Path | None
    libnvidia_ml: Path | None  # libnvidia-ml.so.<version>
    nvidia_modprobe: Path | None  # may be of an older release: nvidia-modprobe has its own


@dataclasses.dataclass(frozen=True)
class RealParts:
    cache_dir: Path
    main: DriverParts  # Debian's current branch: both trees, GSP firmware, nvidia-smi, libnvidia-ml
    legacy: DriverParts  # nvidia-tesla-470: the proprietary tree only
    packages: dict[str, str]  # package -> Debian version downloaded
    origins: dict[str, dict]  # "<main|legacy>.<field>" -> package, version, member, source

    @property
    def versions(self) -> dict[str, str]:
        return {"main": self.main.version, "legacy": self.legacy.version}

    def driver(self, version: str) -> DriverParts:
        for d in (self.main, self.legacy):
            if d.version == version:
                return d
        raise KeyError(f"no real parts for {version} (have {self.main.version}, {self.legacy.version})")

    def to_json(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))


def default_log(msg: str) -> None:
    print(f"[realparts] {msg}", file=sys.stderr, flush=True)


def _hash(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---------------------------------------------------------- version choice


def choose(available: dict[str, list[tuple[str, str]]]) -> dict[str, str]:
    """Package -> Debian version: the newest upstream version every main package has
    (Debian's security updates do not always cover the open tree), the newest 470, and
    the newest nvidia-modprobe not newer than the main driver."""
    pins: dict[str, str] = {}

    def pick(pkg: str, up: str) -> None:
        pins[pkg] = next(v for v, _ in available[pkg] if upstream(v) == up)

    ups = [{upstream(v) for v, _ in available[p]} for p in MAIN_PACKAGES.values()]
    common = set.intersection(*ups)
    if not common:
        have = {p: [v for v, _ in available[p]] for p in MAIN_PACKAGES.values()}
        raise ProvisionError(f"no driver version has all of {list(MAIN_PACKAGES.values())}: {have}")
    main = max(common, key=version_key)
    for pkg in MAIN_PACKAGES.values():
        pick(pkg, main)

    legacy_src = LEGACY_PACKAGES["kernel"]
    if not available[legacy_src]:
        raise ProvisionError(f"the archive has no {legacy_src}")
    legacy = max((upstream(v) for v, _ in available[legacy_src]), key=version_key)
    for pkg in LEGACY_PACKAGES.values():
        if any(upstream(v) == legacy for v, _ in available[pkg]):
            pick(pkg, legacy)

    older = [v for v, _ in available[MODPROBE_PACKAGE] if version_key(upstream(v)) <= version_key(main)]
    if older:
        pins[MODPROBE_PACKAGE] = max(older, key=lambda v: version_key(upstream(v)))
    return pins


# ---------------------------------------------------------------- unpacking


def _kernel_version(tree: Path) -> str:
    """The version NVIDIA's Kbuild compiles in (NV_VERSION_STRING)."""
    m = re.search(r'NV_VERSION_STRING=\\"([0-9.]+)\\"', (tree / "Kbuild").read_text())
    if not m:
        raise ProvisionError(f"{tree}/Kbuild defines no NV_VERSION_STRING")
    return m.group(1)


def _unpack(pins: dict[str, str], debs: Path, dest: Path, log: Log) -> None:
    for pkg, ver in pins.items():
        (dest / "pkg" / pkg).mkdir(parents=True)
        run(["dpkg-deb", "-x", str(debs / deb_name(pkg, ver)), str(dest / "pkg" / pkg)])
        for tarball in sorted((dest / "pkg" / pkg / "usr/src").glob("*.tar.xz")):
            out = dest / "trees" / pkg
            out.mkdir(parents=True)
            run(["tar", "-xJf", str(tarball), "-C", str(out)], log=log)
            tarball.unlink()  # unpacked: no need to keep it twice


def _find(root: Path, patterns: list[str]) -> Path | None:
    for pattern in patterns:
        hits = sorted(p for p in root.glob(pattern) if p.is_file() and not p.is_symlink())
        if hits:
            return hits[0]
    return None


# DriverParts field -> where it sits in its package ({v}: the driver version).
# The kernel trees come from usr/src/*.tar.xz, unpacked into trees/<pkg>/modules/<name>/.
FILE_PATTERNS = {
    "firmware_dir": ["lib/firmware/nvidia/{v}/gsp_*.bin"],  # the field is the directory
    "nvidia_smi": ["usr/lib/nvidia/*/nvidia-smi", "usr/bin/nvidia-smi"],
    "libnvidia_ml": ["usr/lib/x86_64-linux-gnu/**/libnvidia-ml.so.{v}"],
    "nvidia_modprobe": ["usr/bin/nvidia-modprobe"],
}
FIELDS = ["kernel", "kernel_open", *FILE_PATTERNS]


def _locate(pins: dict[str, str], packages: dict[str, str], dest: Path) -> tuple[dict, dict]:
    """Fields of one DriverParts (paths relative to dest) and where each came from."""
    version = upstream(pins[packages["kernel"]])
    fields: dict[str, str | None] = {"version": version}
    origins: dict[str, dict] = {}
    for field in FIELDS:
        pkg = packages.get(field)
        fields[field] = None
        if pkg not in pins:
            continue
        if field in ("kernel", "kernel_open"):
            kbuilds = sorted((dest / "trees" / pkg / "modules").glob("*/Kbuild"))
            hit = kbuilds[0].parent if kbuilds else None
        else:
            hit = _find(dest / "pkg" / pkg, [p.format(v=version) for p in FILE_PATTERNS[field]])
            if hit and field == "firmware_dir":
                hit = hit.parent
        if hit is None:
            raise ProvisionError(f"{pkg} {pins[pkg]} has no {field} where expected")
        fields[field] = str(hit.relative_to(dest))
        if field in ("kernel", "kernel_open"):
            member = f"usr/src/*.tar.xz:{hit.relative_to(dest / 'trees' / pkg)}"
            built = _kernel_version(hit)
            if built != version:
                raise ProvisionError(f"{pkg} {pins[pkg]}: its Kbuild builds {built}, not {version}")
        else:
            member = str(hit.relative_to(dest / "pkg" / pkg))
        origins[field] = {"package": pkg, "version": pins[pkg], "member": member}
    return fields, origins


def _parts_from(record: dict, dest: Path) -> RealParts:
    def driver(d: dict) -> DriverParts:
        return DriverParts(**{k: (v if k == "version" or v is None else dest / v) for k, v in d.items()})

    return RealParts(
        cache_dir=dest,
        main=driver(record["main"]),
        legacy=driver(record["legacy"]),
        packages=record["packages"],
        origins=record["origins"],
    )


# ----------------------------------------------------------------- provision


def _check_machine() -> None:
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        raise ProvisionError("the real parts are Debian amd64 packages: needs Linux on x86_64")
    if os.geteuid() != 0:
        raise ProvisionError("provisioning the real parts needs root (apt-get as root, shared cache)")
    for tool in ("apt-get", "apt-cache", "dpkg-deb", "tar", "xz"):
        if not shutil.which(tool):
            raise ProvisionError(f"provisioning the real parts needs a Debian-family host: {tool} not found")


# What the tier runs on this machine: command -> Debian package (from the system's own apt).
HOST_TOOLS = {"makeself": "makeself", "xz": "xz-utils", "make": "make", "gcc": "gcc",
              "modinfo": "kmod", "unshare": "util-linux", "readelf": "binutils"}


def host_tools(log: Log = default_log) -> None:
    """Install the host tools the tier needs that are missing (system apt, main only)."""
    _check_machine()
    missing = sorted({pkg for tool, pkg in HOST_TOOLS.items() if not shutil.which(tool)})
    if missing:
        with locked(CACHE_ROOT / ".lock"):
            run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], log=log)


def _resolve(apt: PrivateApt) -> tuple[dict[str, str], dict[str, list[tuple[str, str]]]]:
    """Versions to use. Remembered per state of the package lists (apt-cache costs 0.5 s)."""
    lists = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in (apt.root / "lists").iterdir())
    memo = apt.root / "resolved.json"
    state = _hash(RECIPE_VERSION, lists)
    with contextlib.suppress(OSError, ValueError, KeyError):
        saved = json.loads(memo.read_text())
        if saved["state"] == state:
            return saved["pins"], {k: [tuple(x) for x in v] for k, v in saved["available"].items()}
    names = [*MAIN_PACKAGES.values(), *LEGACY_PACKAGES.values(), MODPROBE_PACKAGE]
    available = apt.madison(names)
    pins = choose(available)
    memo.write_text(json.dumps({"state": state, "pins": pins, "available": available}))
    return pins, available


def _fetch(apt: PrivateApt, debs: Path) -> tuple[dict[str, str], dict[str, list[tuple[str, str]]]]:
    """Choose versions and download what is missing; re-read stale lists once."""
    for attempt in (1, 2):
        try:
            pins, available = _resolve(apt)
            missing = {p: v for p, v in pins.items() if not (debs / deb_name(p, v)).exists()}
            if missing:
                t0 = time.monotonic()
                apt.download(missing, debs)
                apt.log(f"downloaded {len(missing)} packages in {time.monotonic() - t0:.1f} s")
            return pins, available
        except ProvisionError:
            if apt.updated or attempt == 2:
                raise
            apt.update()  # the archive moved on since the lists were read
    raise AssertionError("unreachable")


def _record(pins: dict[str, str], available: dict, dest: Path, log: Log) -> dict:
    """Unpack into dest and describe the result (paths relative to dest)."""
    if dest.exists():
        shutil.rmtree(dest)
    _unpack(pins, dest.parent.parent / "debs", dest, log)
    main, main_origins = _locate(pins, {**MAIN_PACKAGES, "nvidia_modprobe": MODPROBE_PACKAGE}, dest)
    legacy, legacy_origins = _locate(pins, LEGACY_PACKAGES, dest)
    origins = {}
    for name, found in (("main", main_origins), ("legacy", legacy_origins)):
        for field, o in found.items():
            o["source"] = next(s for v, s in available[o["package"]] if v == o["version"])
            origins[f"{name}.{field}"] = o
    return {"main": main, "legacy": legacy, "packages": pins, "origins": origins}


def provision(log: Log = default_log) -> RealParts:
    """Download (once) and unpack NVIDIA's real parts; return where they are."""
    _check_machine()
    t0 = time.monotonic()
    try:
        CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ProvisionError(f"cannot make the cache dir (NDI_REALPARTS_CACHE): {e}") from e
    with locked(CACHE_ROOT / ".lock"):
        apt = PrivateApt(CACHE_ROOT / "apt", log, COMPONENTS)
        apt.configure()
        if not apt.has_lists() or os.environ.get("NDI_REALPARTS_REFRESH") == "1":
            apt.update()
        pins, available = _resolve(apt) if apt.has_lists() else ({}, {})
        stamp = CACHE_ROOT / "parts" / (_hash(RECIPE_VERSION, pins) + ".json")
        if not stamp.exists():
            debs = CACHE_ROOT / "debs"
            debs.mkdir(parents=True, exist_ok=True)
            pins, available = _fetch(apt, debs)
            stamp = CACHE_ROOT / "parts" / (_hash(RECIPE_VERSION, pins) + ".json")
            t1 = time.monotonic()
            record = _record(pins, available, stamp.with_suffix(""), log)
            tmp = stamp.with_suffix(".tmp")
            tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
            os.replace(tmp, stamp)  # the stamp: written last, atomically
            log(f"unpacked in {time.monotonic() - t1:.1f} s")
        record = json.loads(stamp.read_text())
    log(f"ready: {record['main']['version']} and {record['legacy']['version']} "
        f"in {time.monotonic() - t0:.2f} s")
    return _parts_from(record, stamp.with_suffix(""))


if __name__ == "__main__":
    print(json.dumps(provision().to_json(), indent=2))
