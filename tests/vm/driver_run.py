"""Build ``NVIDIA-Linux-x86_64-<V>.run`` files for the qemu tier.

The archive is a makeself file with a header that behaves like NVIDIA's
(``-x``/``--extract-only``, unknown flags passed to the embedded
``nvidia-installer``), holding:

- ``nvidia-installer`` (``driver/nvidia-installer``): really builds ``kernel/``
  with kbuild against the ``--kernel-source-path`` it is given;
- ``kernel/``: the fake NVIDIA module sources (``kmod-src/``) with
  ``MODULE_VERSION`` set to the driver version;
- ``nvidia-smi``, ``libnvidia-ml.so.<V>``, ``libcuda.so.<V>`` built here with
  gcc (the guest has the same glibc), and ``nvidia-modprobe``: NVIDIA's real binary
  (Debian's package, tests/fixtures/realmodprobe.py), which makes the device files
  from what the guest kernel's modules registered (/proc/devices, /sys/module);
- ``fake.conf``: test knobs (vermagic rewrite, forced build failure, drm dep).

A kbuild of the four modules takes about 2 minutes under TCG (most of it is
kbuild's compiler probes, each a gcc run), so only the first install of the
tier compiles in the guest. The other versions are built here, with the same
kbuild against the same ``linux-headers-<abi>`` the guest has, and shipped in
``kernel/prebuilt/``: their ``nvidia-installer`` installs those instead of
compiling (``NV_FAKE_PREBUILT=1``; say ``NDI_VM_BUILD_ALL=1`` to compile every
version in the guest).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.fixtures import nvidia_options, realmodprobe
from tests.fixtures.runfile import pack_run, run_name

HERE = Path(__file__).resolve().parent
KMOD_SRC = HERE / "kmod-src"
DRIVER_SRC = HERE / "driver"
MODULE_FILES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm")
KERNEL_FILES = (
    "Kbuild",
    "Makefile",
    "nv-fake.h",
    "nvidia.c",
    "nvidia-uvm.c",
    "nvidia-modeset.c",
    "nvidia-drm.c",
)


def _gcc(argv: list[str], cwd: Path) -> None:
    subprocess.run(["gcc", "-O2", "-Wall", *argv], cwd=cwd, check=True, capture_output=True)


def build_userspace(payload: Path, version: str) -> None:
    """libnvidia-ml.so.<V>, libcuda.so.<V> (with SONAME links) and nvidia-smi."""
    ver = f'-DNV_VERSION="{version}"'
    _gcc(
        [
            "-shared",
            "-fPIC",
            ver,
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
            f"libnvidia-ml.so.{version}",
            str(DRIVER_SRC / "nvml.c"),
        ],
        payload,
    )
    _gcc(
        [
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            f"libcuda.so.{version}",
            str(DRIVER_SRC / "cuda.c"),
        ],
        payload,
    )
    with tempfile.TemporaryDirectory() as tmp:
        link = Path(tmp) / "libnvidia-ml.so"
        link.symlink_to(payload / f"libnvidia-ml.so.{version}")
        _gcc(
            ["-o", "nvidia-smi", str(DRIVER_SRC / "nvidia-smi.c"), f"-L{tmp}", "-lnvidia-ml"],
            payload,
        )


def kernel_tree(dest: Path, version: str) -> Path:
    """The module sources with MODULE_VERSION = ``version``, in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in KERNEL_FILES:
        shutil.copy2(KMOD_SRC / name, dest / name)
    (dest / "nv-version.h").write_text(f'#define NV_VERSION_STRING "{version}"\n')
    return dest


def kbuild(headers: Path, src: Path, *extra: str) -> None:
    """make -C <headers> M=<src> modules. Headers unpacked off their Debian paths (the
    output dir's Makefile includes the source dir by its absolute path) are entered through
    the source dir their Makefile names, with the output dir as O=."""
    top = ["-C", str(headers)]
    named = re.search(r"^include\s+(\S+)/Makefile\s*$", (headers / "Makefile").read_text(), re.M)
    if named and not Path(named.group(1)).is_dir():
        top = ["-C", str(headers.parent / Path(named.group(1)).name), f"O={headers}"]
    cp = subprocess.run(
        ["make", *top, f"M={src}", "-j2", *extra, "modules"],
        capture_output=True,
        text=True,
    )
    if cp.returncode != 0:
        raise RuntimeError(f"kbuild in {src} failed:\n{cp.stdout[-2000:]}\n{cp.stderr[-3000:]}")


def build_modules(
    headers: Path, dest: Path, version: str, *, drm_dep: bool = True, broken_uvm: bool = False
) -> Path:
    """Build the four modules here against ``headers``; returns the build dir.

    ``broken_uvm``: nvidia-uvm needs a symbol no nvidia.ko exports.
    """
    src = kernel_tree(dest, version)
    extra = [f"NV_FAKE_DRM_DEP={1 if drm_dep else 0}"]
    if broken_uvm:
        extra += ["NV_FAKE_BROKEN_UVM=1", "KBUILD_MODPOST_WARN=1"]
    kbuild(headers, src, *extra)
    return src


def build_holder(headers: Path, dest: Path, symvers: Path) -> Path:
    """nvidia_holder.ko, linked against the nvidia symbols in ``symvers``."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in (KMOD_SRC / "holder").iterdir():
        shutil.copy2(f, dest / f.name)
    kbuild(headers, dest, f"KBUILD_EXTRA_SYMBOLS={symvers}")
    return dest / "nvidia_holder.ko"


def build_fwreq(headers: Path, dest: Path) -> Path:
    """ndi_fwreq.ko: its init asks the firmware loader for ``name=`` and fails if not found."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in (KMOD_SRC / "fwreq").iterdir():
        shutil.copy2(f, dest / f.name)
    kbuild(headers, dest)
    return dest / "ndi_fwreq.ko"


def _other_kernel():
    spec = importlib.util.spec_from_file_location("other_kernel", DRIVER_SRC / "other_kernel.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def as_built_for(ko: Path, release: str, other: str) -> None:
    """Rewrite ``ko`` as if built for kernel ``other`` (vermagic and symbol CRC)."""
    ko.write_bytes(_other_kernel().patch(ko.read_bytes(), release, other))


def other_release(release: str) -> str:
    """A kernel release as long as ``release`` that is not it: 6.1.0-56-amd64 -> 6.1.0-99-amd64."""
    m = re.match(r"(\d+\.\d+\.\d+-)(\d+)(-.*)", release)
    if not m:
        raise ValueError(f"unexpected kernel release {release!r}")
    n = m.group(2)
    fake = ("9" * len(n)) if n != "9" * len(n) else ("1" * len(n))
    return m.group(1) + fake + m.group(3)


def build_run(
    out_dir: Path,
    version: str,
    *,
    vermagic: str | None = None,
    build_fail: bool = False,
    drm_dep: bool = True,
    prebuilt: Path | None = None,
) -> Path:
    """Write ``<out_dir>/NVIDIA-Linux-x86_64-<version>.run`` and return its path.

    ``prebuilt``: a dir holding the four ``.ko`` files to ship instead of compiling.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ndi-run-") as tmp:
        t = Path(tmp)
        payload = t / f"NVIDIA-Linux-x86_64-{version}"
        kernel = kernel_tree(payload / "kernel", version)
        if prebuilt is not None:
            (kernel / "prebuilt").mkdir()
            for m in MODULE_FILES:
                shutil.copy2(prebuilt / f"{m}.ko", kernel / "prebuilt" / f"{m}.ko")
        for name in ("nvidia-installer", "other_kernel.py"):
            shutil.copy2(DRIVER_SRC / name, payload / name)
            (payload / name).chmod(0o755)
        shutil.copy2(realmodprobe.binary(), payload / "nvidia-modprobe")
        (payload / ".version").write_text(version + "\n")
        # Exactly the options this release's nvidia-installer accepts (option_table.h).
        (payload / ".options").write_text("\n".join(sorted(nvidia_options.accepted(version))) + "\n")
        (payload / "fake.conf").write_text(
            f"NV_FAKE_VERMAGIC={vermagic or ''}\n"
            f"NV_FAKE_BUILD_FAIL={1 if build_fail else 0}\n"
            f"NV_FAKE_DRM_DEP={1 if drm_dep else 0}\n"
            f"NV_FAKE_PREBUILT={1 if prebuilt is not None else 0}\n"
        )
        (payload / ".manifest").write_text(
            f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {version} (fake)\n"
        )
        build_userspace(payload, version)
        out = pack_run(payload, out_dir / run_name(version), version,
                       "--packaging-date", "Thu Jan  1 00:00:00 UTC 2025")
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
