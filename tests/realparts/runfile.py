"""build_real_run: NVIDIA-Linux-x86_64-<V>.run made of NVIDIA's real parts.

A makeself archive packed by tests/fixtures/runfile.py ``pack_run`` (NVIDIA's
``-x``/``--extract-only`` header), laid out like NVIDIA's::

    kernel/               the proprietary module tree (Kbuild, Makefile, conftest.sh, blobs)
    kernel-open/          the open module tree (535; 470 has none)
    firmware/gsp_*.bin    GSP firmware (535)
    nvidia-smi, libnvidia-ml.so.<V>, nvidia-modprobe
    nvidia-installer      the stand-in (tests/realparts/nvidia-installer)
    .version              <V>
    .build-directory      the default kernel module build directory (.manifest line 7)
    .options.json         the option table nvidia-installer <V> accepts
    .parts.json           where each real part came from (Debian package, version)

Debian's ``debian/`` packaging dir is left out of the trees: NVIDIA's .run has none.
Archives are cached by content (version, flavor, every input file's hash, the
stand-in's source, makeself's header): a rebuild costs a tree walk.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.fixtures.nvidia_options import option_table
from tests.fixtures.runfile import STOCK_HEADER, pack_run, run_name
from tests.realparts import cache
from tests.realparts.provision import BRANCHES, DriverParts, ProvisionError, RealParts

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "nvidia-installer"
LOG_KBUILD = HERE / "GNUmakefile.log-kbuild"  # kbuild's recorded commands into make's output
TREE_EXCLUDE = ("debian",)
# full: every tree the version has (NVIDIA's 470/535 .run); proprietary / open: one tree.
FLAVORS = ("full", "proprietary", "open")
# NVIDIA's 470 and 535 .run files are xz-compressed (555+ use zstd): extracting one
# needs xz on the node, and so does this one. The level changes neither the format nor
# the extraction (makeself's header pipes the payload through ``xz -d`` at any level); -0
# packs the 535 .run (320 MB of payload) with about 30 % less CPU than -1 (36 s against
# 52 s, 2026-11-29, loaded 2-core machine) for 5 % more bytes (123 MB against 117 MB).
COMPRESSION = ["--xz", "--complevel", "0", "--threads", "0"]


def _trees(driver: DriverParts, flavor: str) -> dict[str, Path]:
    if flavor not in FLAVORS:
        raise ValueError(f"flavor {flavor!r}: one of {FLAVORS}")
    trees = {}
    if flavor in ("full", "proprietary") and driver.kernel:
        trees["kernel"] = driver.kernel
    if flavor in ("full", "open") and driver.kernel_open:
        trees["kernel-open"] = driver.kernel_open
    if not trees or (flavor != "full" and len(trees) != 1):
        raise ValueError(f"{driver.version} has no {flavor} kernel module tree")
    return trees


def _inputs(driver: DriverParts, flavor: str, userspace: Path | None,
            parts: RealParts) -> dict[str, Path]:
    """Payload name -> source file or tree."""
    files: dict[str, Path] = {name: tree for name, tree in _trees(driver, flavor).items()}
    if userspace is not None:
        # The fixture's nvidia-smi/NVML/nvidia-modprobe, which drive the FakeKernel of
        # the pod-like chroot (real ones need a GPU): real kernel parts, fixture user space.
        for name in ("nvidia-smi", "nvidia-modprobe", f"libnvidia-ml.so.{driver.version}"):
            files[name] = userspace / name
    else:
        for field in ("nvidia_smi", "libnvidia_ml"):
            if getattr(driver, field) is None:
                raise ValueError(f"{driver.version} has no real {field}")
        files["nvidia-smi"] = driver.nvidia_smi
        files[f"libnvidia-ml.so.{driver.version}"] = driver.libnvidia_ml
        # Debian's nvidia-modprobe, NVIDIA's own (its own release train: the 470 branch
        # takes the one provisioned with the main driver); never a stand-in.
        modprobe = driver.nvidia_modprobe or parts.main.nvidia_modprobe
        if modprobe is None:
            raise ProvisionError(f"Debian's nvidia-modprobe was not provisioned for "
                                 f"{driver.version}: the archive has none (check {parts.cache_dir})")
        files["nvidia-modprobe"] = modprobe
    if driver.firmware_dir:
        for fw in sorted(driver.firmware_dir.glob("gsp_*.bin")):
            files[f"firmware/{fw.name}"] = fw
    files["nvidia-installer"] = STANDIN
    return files


def _payload(driver: DriverParts, flavor: str, parts: RealParts, table: dict, dest: Path,
             userspace: Path | None) -> None:
    for name, src in _inputs(driver, flavor, userspace, parts).items():
        out = dest / name
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, out, symlinks=True, ignore=shutil.ignore_patterns(*TREE_EXCLUDE))
        else:
            shutil.copyfile(src, out)
            out.chmod(0o755 if name.startswith(("nvidia-", "libnvidia")) else 0o644)
    trees = _trees(driver, flavor)
    for name in trees:  # NVIDIA's Makefile runs unchanged; this logs kbuild's commands
        shutil.copyfile(LOG_KBUILD, dest / name / "GNUmakefile")
    (dest / ".version").write_text(driver.version + "\n")
    (dest / ".build-directory").write_text(("kernel" if "kernel" in trees else "kernel-open") + "\n")
    (dest / ".options.json").write_text(json.dumps({"for_version": driver.version, **table}, indent=1))
    origins = {k: v for k, v in parts.origins.items() if v["version"].startswith(driver.version)}
    if userspace is None:  # Debian's nvidia-modprobe: this branch's, else main's (see _inputs)
        branch = next(n for n in BRANCHES if getattr(parts, n) == driver)
        key = f"{branch if driver.nvidia_modprobe else 'main'}.nvidia_modprobe"
        origins[key] = parts.origins[key]
    (dest / ".parts.json").write_text(json.dumps(origins, indent=1, sort_keys=True) + "\n")


def build_real_run(version: str, flavor: str, parts: RealParts, dest_dir: Path | None = None, *,
                   userspace: Path | None = None) -> Path:
    """The cached NVIDIA-Linux-x86_64-<version>.run (under dest_dir, default the cache's runs/).

    Shared: copy it before changing it. flavor: "full", "proprietary" or "open".
    ``userspace``: a dir with nvidia-smi, nvidia-modprobe, libnvidia-ml.so.<V> to ship
    instead of the real ones (tests/fixtures/runfile.py ``driver_payload``)."""
    driver = parts.driver(version)
    table = option_table(version)
    inputs = _inputs(driver, flavor, userspace, parts)
    hashes = {name: cache.content_hash(src, TREE_EXCLUDE) for name, src in inputs.items()}
    k = cache.key(version, flavor, hashes, table, COMPRESSION,
                  cache.file_hash(STOCK_HEADER), cache.file_hash(Path(__file__)),
                  cache.file_hash(LOG_KBUILD))

    def produce(work: Path) -> None:
        payload = work / f"NVIDIA-Linux-x86_64-{version}"
        _payload(driver, flavor, parts, table, payload, userspace)
        pack_run(payload, work / run_name(version), version, "--sha256", *COMPRESSION,
                 "--tar-quietly", "--noprogress")
        shutil.rmtree(payload)

    return cache.cached_dir(Path(dest_dir) if dest_dir else "runs", k, produce) / run_name(version)
