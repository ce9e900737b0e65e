"""Fetch NVIDIA's real driver parts from Debian's archive, unpacked and cached.

Debian ships NVIDIA's kernel module trees (Kbuild, Makefile, conftest.sh and
the ``nv-kernel.o_binary`` blobs), the GSP firmware, ``nvidia-smi``,
``libnvidia-ml`` and ``nvidia-modprobe`` in the components ``contrib``,
``non-free`` and ``non-free-firmware``, which this machine's apt config does
not enable: apt runs with a private configuration (tests/debapt.py), which
also adds the suites ``trixie`` (Debian 13's 550 parts) and ``bookworm-backports``
(the 6.12 kernel they are built against, tests/realparts/newer_kernel.py). Each
branch of ``BRANCHES`` is taken from its own suites.

Cache layout under ``$NDI_REALPARTS_CACHE`` (default /var/cache/ndi-realparts)::

    apt/                 apt.conf, sources.list, lists/, cache/ (private apt state)
    debs/<pkg>_<ver>.deb the downloaded packages
    parts/<key>/<branch>/  dpkg-deb -x of each package in pkg/, kernel trees in trees/
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

# A branch's parts: DriverParts field -> Debian package.
DRIVER_PACKAGES = {
    "kernel": "nvidia-kernel-source",
    "kernel_open": "nvidia-open-kernel-source",
    "firmware_dir": "firmware-nvidia-gsp",
    "nvidia_smi": "nvidia-smi",
    "libnvidia_ml": "libnvidia-ml1",
    "nvidia_modprobe": "nvidia-modprobe",  # its own release train (see choose_branch)
}
# 470 has no open modules and no GSP firmware; its nvidia-smi and libnvidia-ml are taken
# when Debian has them at the same version.
LEGACY_PACKAGES = {
    "kernel": "nvidia-tesla-470-kernel-source",
    "nvidia_smi": "nvidia-tesla-470-smi",
    "libnvidia_ml": "libnvidia-tesla-470-ml1",
}
OWN_TRAIN = ("nvidia_modprobe",)


@dataclasses.dataclass(frozen=True)
class Branch:
    packages: dict[str, str]  # DriverParts field -> package
    required: tuple[str, ...]  # fields every package of the chosen version must have
    series: str  # the upstream series, e.g. "535."
    suites: tuple[str, ...] = ()  # suites to take it from; () = this machine's own


# Suites of the host's archive this machine does not enable (PrivateApt extra_suites):
# trixie for the 550 parts, bookworm-backports for the 6.12 kernel they are built
# against (tests/realparts/newer_kernel.py).
EXTRA_SUITES = ("trixie", "bookworm-backports")
BRANCHES = {
    # Debian 12's driver: every package of one 535 release.
    "main": Branch(DRIVER_PACKAGES, tuple(f for f in DRIVER_PACKAGES if f not in OWN_TRAIN), "535."),
    "legacy": Branch(LEGACY_PACKAGES, ("kernel",), "470."),
    # Debian 13's: R550, the first branch with --skip-module-load; open modules that build
    # against 6.12 (issue 21). nvidia-modprobe there is 570.133.07 (see choose_branch).
    "r550": Branch(DRIVER_PACKAGES, tuple(f for f in DRIVER_PACKAGES if f not in OWN_TRAIN),
                   "550.", ("trixie",)),
}

RECIPE_VERSION = "2"


@dataclasses.dataclass(frozen=True)
class DriverParts:
    """One driver version's real parts. Paths point into the shared cache: never write there."""

    version: str
    kernel: Path | None  # NVIDIA's proprietary module tree (the .run's kernel/)
    kernel_open: Path | None  # the open module tree (kernel-open/)
    firmware_dir: Path | None  # gsp_*.bin (the .run's firmware/)
    nvidia_smi: Path | None
    libnvidia_ml: Path | None  # libnvidia-ml.so.<version>
    nvidia_modprobe: Path | None  # may be of another release: nvidia-modprobe has its own


@dataclasses.dataclass(frozen=True)
class RealParts:
    cache_dir: Path
    main: DriverParts  # Debian 12's 535: both trees, GSP firmware, nvidia-smi, libnvidia-ml
    legacy: DriverParts  # nvidia-tesla-470: the proprietary tree only
    r550: DriverParts  # Debian 13's 550: both trees, GSP firmware, nvidia-smi, libnvidia-ml
    packages: dict[str, dict[str, str]]  # branch -> package -> Debian version downloaded
    origins: dict[str, dict]  # "<branch>.<field>" -> package, version, member, source

    @property
    def versions(self) -> dict[str, str]:
        return {name: getattr(self, name).version for name in BRANCHES}

    def driver(self, version: str) -> DriverParts:
        for name in BRANCHES:
            if getattr(self, name).version == version:
                return getattr(self, name)
        raise KeyError(f"no real parts for {version} (have {self.versions})")

    def to_json(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))


def default_log(msg: str) -> None:
    print(f"[realparts] {msg}", file=sys.stderr, flush=True)


def _hash(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---------------------------------------------------------- version choice


def in_suites(source: str, suites: tuple[str, ...]) -> bool:
    """source: "uri suite/component" (PrivateApt.madison); () = the host's own suites."""
    suite = source.split()[-1].split("/")[0]
    return suite in suites if suites else suite not in EXTRA_SUITES


def choose_branch(branch: Branch, available: dict[str, list[tuple[str, str]]]) -> dict[str, str]:
    """Package -> Debian version: the newest release of the series that every required
    package has in the branch's suites (Debian's security updates do not always cover
    the open tree), the other packages at that release when they have it, and the
    newest nvidia-modprobe not newer than it (else the oldest newer one)."""
    def versions(pkg: str) -> list[str]:
        return [v for v, src in available.get(pkg, []) if in_suites(src, branch.suites)]

    ups = [{upstream(v) for v in versions(branch.packages[f]) if upstream(v).startswith(branch.series)}
           for f in branch.required]
    common = set.intersection(*ups)
    if not common:
        have = {branch.packages[f]: versions(branch.packages[f]) for f in branch.required}
        raise ProvisionError(f"no {branch.series}x release has all of "
                             f"{[branch.packages[f] for f in branch.required]}: {have}")
    release = max(common, key=version_key)
    pins: dict[str, str] = {}
    for field, pkg in branch.packages.items():
        if field in OWN_TRAIN:
            trains = sorted(versions(pkg), key=lambda v: version_key(upstream(v)))
            older = [v for v in trains if version_key(upstream(v)) <= version_key(release)]
            if trains:
                pins[pkg] = older[-1] if older else trains[0]
            continue
        same = [v for v in versions(pkg) if upstream(v) == release]
        if same:
            pins[pkg] = same[0]
    return pins


def choose(available: dict[str, list[tuple[str, str]]]) -> dict[str, dict[str, str]]:
    """Branch -> package -> Debian version, for every branch of BRANCHES."""
    return {name: choose_branch(branch, available) for name, branch in BRANCHES.items()}


# ---------------------------------------------------------------- unpacking


def _kernel_version(tree: Path) -> str:
    """The version NVIDIA's Kbuild compiles in (NV_VERSION_STRING)."""
    m = re.search(r'NV_VERSION_STRING=\\"([0-9.]+)\\"', (tree / "Kbuild").read_text())
    if not m:
        raise ProvisionError(f"{tree}/Kbuild defines no NV_VERSION_STRING")
    return m.group(1)


def _unpack(pins: dict[str, str], debs: Path, dest: Path, log: Log) -> None:
    """One branch's packages into dest/pkg/<pkg>, kernel trees into dest/trees/<pkg>."""
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
    # the field is the directory; trixie moved firmware to usr/lib/firmware (merged /usr)
    "firmware_dir": ["lib/firmware/nvidia/{v}/gsp_*.bin", "usr/lib/firmware/nvidia/{v}/gsp_*.bin"],
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
        **{name: driver(record[name]) for name in BRANCHES},
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
              "modinfo": "kmod", "unshare": "util-linux", "readelf": "binutils",
              # Debian 6.12 headers ship vmlinux: kbuild makes each module's BTF with it
              "pahole": "pahole"}


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
    names = sorted({pkg for branch in BRANCHES.values() for pkg in branch.packages.values()})
    available = apt.madison(names)
    pins = choose(available)
    memo.write_text(json.dumps({"state": state, "pins": pins, "available": available}))
    return pins, available


def _fetch(apt: PrivateApt, debs: Path) -> tuple[dict[str, str], dict[str, list[tuple[str, str]]]]:
    """Choose versions and download what is missing; re-read stale lists once."""
    for attempt in (1, 2):
        try:
            pins, available = _resolve(apt)
            wanted = {(p, v) for branch in pins.values() for p, v in branch.items()}
            missing = {(p, v) for p, v in wanted if not (debs / deb_name(p, v)).exists()}
            if missing:
                t0 = time.monotonic()
                for branch in pins.values():  # one version of a package per apt-get call
                    todo = {p: v for p, v in branch.items() if (p, v) in missing}
                    if todo:
                        apt.download(todo, debs)
                apt.log(f"downloaded {len(missing)} packages in {time.monotonic() - t0:.1f} s")
            return pins, available
        except ProvisionError:
            if apt.updated or attempt == 2:
                raise
            apt.update()  # the archive moved on since the lists were read
    raise AssertionError("unreachable")


def _record(pins: dict[str, dict[str, str]], available: dict, dest: Path, log: Log) -> dict:
    """Unpack each branch into dest/<branch>/ and describe the result (paths relative to dest)."""
    if dest.exists():
        shutil.rmtree(dest)
    record: dict = {"packages": pins, "origins": {}}
    for name, branch in BRANCHES.items():
        _unpack(pins[name], dest.parent.parent / "debs", dest / name, log)
        fields, found = _locate(pins[name], branch.packages, dest / name)
        record[name] = {k: (v if k == "version" or v is None else f"{name}/{v}") for k, v in fields.items()}
        for field, o in found.items():
            o["source"] = next(s for v, s in available[o["package"]] if v == o["version"])
            record["origins"][f"{name}.{field}"] = o
    return record


def provision(log: Log = default_log) -> RealParts:
    """Download (once) and unpack NVIDIA's real parts; return where they are."""
    _check_machine()
    t0 = time.monotonic()
    try:
        CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ProvisionError(f"cannot make the cache dir (NDI_REALPARTS_CACHE): {e}") from e
    with locked(CACHE_ROOT / ".lock"):
        apt = PrivateApt(CACHE_ROOT / "apt", log, COMPONENTS, EXTRA_SUITES)
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
    log(f"ready: {', '.join(record[name]['version'] for name in BRANCHES)} "
        f"in {time.monotonic() - t0:.2f} s")
    return _parts_from(record, stamp.with_suffix(""))


if __name__ == "__main__":
    print(json.dumps(provision().to_json(), indent=2))
