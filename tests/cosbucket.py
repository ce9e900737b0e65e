"""A fake cos-tools bucket for one COS build (docs/contract.md §6), for the COS tests.

- headers_tgz: kernel-headers.tgz with usr/src/linux-headers-<release>/ (a
  configured tree as the fake nvidia-installer checks it), and evil variants;
- toolchain_txz: toolchain.tar.xz whose bin/x86_64-cos-linux-gnu-gcc is a
  script (it answers --version and logs its calls), plus a cross ld.lld, a
  sysroot and Rust parts the installer must skip;
- prebuilt_tgz: nvidia-drivers-<V>.tgz with signed open modules (ELF) and
  firmware, as COS publishes them;
- custom_run / signature_tgz: extensions/gpu/NVIDIA-Linux-x86_64-<V>-custom.run
  (precompiled kernel interfaces + mkprecompiled, linked by the fake ld.lld)
  and nvidia-drivers-<V>-signature.tar.gz (one <module>.sig each);
- env_recording_run: a fake NVIDIA .run whose nvidia-installer appends the
  environment it ran with (and ``$CC --version``, ``ld``) to its log, which
  the installer keeps as <install-dir>/nvidia-installer.log;
- Bucket: writes the layout to a directory (file:// tests) or an ArtifactServer.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.fixtures.elfmod import elf_object, fake_pkcs7
from tests.fixtures.kernel import fake_ko
from tests.fixtures.node import COS_113_LSB_RELEASE, COS_BUILD_ID, COS_KERNEL
from tests.fixtures.runfile import driver_payload, pack_run, run_name

TRIPLE = "x86_64-cos-linux-gnu"
CC = f"{TRIPLE}-gcc"
CXX = f"{TRIPLE}-g++"
TOOLCHAIN_ENV = f"CC={CC}\nCXX={CXX}\n"
DEFAULT_V = "535.183.01"  # gpu_default_version
LATEST_V = "550.54.14"  # gpu_latest_version
ALIASES = {"default": DEFAULT_V, "latest": LATEST_V, "R535": DEFAULT_V, "R550": LATEST_V}
ENV_BEGIN = "=== fake COS test: environment seen by nvidia-installer ==="

# An Arm build (issue 42): the board Google names lakitu-arm64 (cos/tools
# src/cmd/cos_kernel_devenv/devenv.sh: lakitu-arm64 is arm64) in /etc/lsb-release, whose
# artifacts lie under <BUILD_ID>/lakitu-arm64/ (src/pkg/cos/artifacts.go NewGCSDownloader).
ARM_BOARD = "lakitu-arm64"
ARM_V = "580.82.07"  # GB200 needs R570+; NVreg_CoherentGPUMemoryMode from 580.65.06
ARM_ALIASES = {"default": ARM_V, "latest": ARM_V, "R580": ARM_V}
ARM_LSB_RELEASE = COS_113_LSB_RELEASE.replace("=lakitu\n", f"={ARM_BOARD}\n").replace(
    "stable-channel lakitu\n", f"stable-channel {ARM_BOARD}\n")


def _add(tar: tarfile.TarFile, name: str, data: bytes | str = b"", mode: int = 0o644,
         kind: bytes = tarfile.REGTYPE, linkname: str = "") -> None:
    raw = data.encode() if isinstance(data, str) else data
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = 1_700_000_000
    if kind == tarfile.REGTYPE:
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
    else:
        info.linkname = linkname
        tar.addfile(info)


def headers_tgz(path: Path, release: str = COS_KERNEL, *, evil: str | None = None) -> Path:
    """kernel-headers.tgz; evil in (None, "dotdot", "absolute", "symlink_out",
    "hardlink_out", "device") adds one malicious member after the good ones."""
    top = f"usr/src/linux-headers-{release}"
    version, patchlevel, sublevel = (release.split("-")[0].rstrip("+").split(".") + ["0"])[:3]
    with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        _add(tar, "usr", kind=tarfile.DIRTYPE, mode=0o755)
        _add(tar, f"{top}/Makefile",
             f"VERSION = {version}\nPATCHLEVEL = {patchlevel}\nSUBLEVEL = {sublevel}\n")
        _add(tar, f"{top}/include/config/kernel.release", release + "\n")
        _add(tar, f"{top}/include/generated/utsrelease.h", f'#define UTS_RELEASE "{release}"\n')
        _add(tar, f"{top}/.config", "CONFIG_MODULES=y\nCONFIG_MODULE_SIG=y\n")
        _add(tar, f"{top}/scripts/module.lds", "/* linker script */\n")
        _add(tar, f"{top}/source", kind=tarfile.SYMTYPE, linkname=".")
        if evil == "dotdot":
            _add(tar, f"{top}/../../../../../../tmp/cos-evil-dotdot", "pwned")
        elif evil == "absolute":
            _add(tar, "/tmp/cos-evil-absolute", "pwned")
        elif evil == "symlink_out":
            _add(tar, f"{top}/escape", kind=tarfile.SYMTYPE, linkname="../../../../etc")
            _add(tar, f"{top}/escape/cos-evil-symlink", "pwned")
        elif evil == "hardlink_out":
            _add(tar, f"{top}/passwd", kind=tarfile.LNKTYPE, linkname="/etc/passwd")
        elif evil == "device":
            _add(tar, f"{top}/kmem", kind=tarfile.CHRTYPE)
        elif evil is not None:
            raise ValueError(evil)
    return path


EVIL_PATHS = ("/tmp/cos-evil-dotdot", "/tmp/cos-evil-absolute", "/etc/cos-evil-symlink")

FAKE_CC = """#!/bin/sh
# Fake COS cross compiler: answers --version, logs every call.
echo "$(basename "$0") $*" >> "${FAKE_CC_LOG:-/dev/null}"
case "$1" in
  --version|-v) echo "$(basename "$0") (fake COS toolchain) 12.2.0"; exit 0 ;;
esac
exit 0
"""
FAKE_LD = """#!/bin/sh
# Fake lld: "-T script -r -o OUT obj..." concatenates the ELF objects into OUT: the
# first one (the interface, with the .modinfo) is what ELF readers see, the binary
# core rides after it; anything else succeeds.
case "$1" in
  --version|-v) echo "LLD 17.0.0 (fake COS toolchain, $(basename "$0"))"; exit 0 ;;
esac
echo "$(basename "$0") $*" >> "${FAKE_CC_LOG:-/dev/null}"
out=; objs=
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=$2; shift ;;
    -T) [ -f "$2" ] || { echo "ld.lld: cannot open linker script $2" >&2; exit 1; }; shift ;;
    -*) ;;
    *) objs="$objs $1" ;;
  esac
  shift
done
[ -n "$out" ] || exit 0
cat $objs > "$out"
"""


def toolchain_txz(path: Path, *, triple: str = TRIPLE, lld: str = FAKE_LD) -> Path:
    with tarfile.open(path, "w:xz", format=tarfile.GNU_FORMAT) as tar:
        _add(tar, "./bin", kind=tarfile.DIRTYPE, mode=0o755)
        _add(tar, f"./bin/{triple}-gcc", FAKE_CC, 0o755)
        _add(tar, f"./bin/{triple}-g++", FAKE_CC, 0o755)
        _add(tar, f"./bin/{triple}-clang", kind=tarfile.SYMTYPE, linkname=f"{triple}-gcc")
        _add(tar, f"./bin/{triple}-ld.lld", lld, 0o755)
        _add(tar, f"./usr/{triple}/usr/include/stdio.h", "/* sysroot */\n")
        _add(tar, "./usr/lib64/rustlib/x86_64-unknown-linux-gnu/lib/libstd.rlib", b"\0" * 4096)
        _add(tar, "./usr/lib64/librustc_driver-abc.so", b"\0" * 4096)
    return path


PREBUILT_MODULES = {
    "nvidia": (),
    "nvidia_modeset": ("nvidia",),
    "nvidia_uvm": ("nvidia",),
    "nvidia_drm": ("drm", "nvidia_modeset", "drm_kms_helper"),
}


def prebuilt_tgz(path: Path, version: str, release: str = COS_KERNEL, *,
                 signed: bool = True) -> Path:
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "drivers", kind=tarfile.DIRTYPE, mode=0o755)
        for name, deps in PREBUILT_MODULES.items():
            ko = fake_ko(name, release, version=version, depends=deps, signed=signed,
                         flavor="open")
            _add(tar, f"drivers/{name.replace('_', '-')}.ko", ko)
        _add(tar, f"firmware/nvidia/{version}/gsp_ga10x.bin", b"prebuilt-firmware " * 64)
    return path


# --------------------------------------------------------------------------- precompiled


MKPRECOMPILED = """#!/bin/sh
# Fake mkprecompiled: --unpack ARCHIVE -o DIR (the fake archive is a tar).
archive=; out=
while [ $# -gt 0 ]; do
  case "$1" in
    --unpack|-u) archive=$2; shift ;;
    -o|--output) out=$2; shift ;;
  esac
  shift
done
[ -f "$archive" ] && [ -d "$out" ] || { echo "mkprecompiled: bad arguments" >&2; exit 1; }
tar -xf "$archive" -C "$out" && rm -f "$archive"
"""
SIGNED_MODULES = ("nvidia.ko", "nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia-drm.ko")


def _precompiled_objects(version: str, release: str) -> dict[str, bytes]:
    """kernel/precompiled/ after mkprecompiled --unpack: the kernel interface objects and
    the pre-linked uvm/drm modules."""
    def interface(name: str, deps: tuple[str, ...], obj: str = "") -> bytes:
        return fake_ko(name, release, version=version, depends=deps, signed=False,
                       sections={".text": f"interface={obj}\n".encode()} if obj else None)

    return {
        "nv-linux.o": interface("nvidia", (), "nv-linux.o"),
        "nv-modeset-linux.o": interface("nvidia_modeset", ("nvidia",), "nv-modeset-linux.o"),
        "nvidia-uvm.ko": interface("nvidia_uvm", ("nvidia",)),
        "nvidia-drm.ko": interface("nvidia_drm", ("drm", "nvidia_modeset", "drm_kms_helper")),
    }


_CORES = {
    "kernel/nvidia/nv-kernel.o_binary": elf_object({".text": b"core=nv-kernel.o_binary\n"}),
    "kernel/nvidia-modeset/nv-modeset-kernel.o_binary":
        elf_object({".text": b"core=nv-modeset-kernel.o_binary\n"}),
}


def precompiled_pieces(version: str, release: str) -> dict[str, bytes]:
    """Files of the -custom.run's kernel/ dir (before mkprecompiled --unpack), as
    NVIDIA's precompiled packages hold them: the kernel interface objects and the
    pre-linked uvm/drm modules in one packed archive, the binary cores beside."""
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in _precompiled_objects(version, release).items():
            _add(tar, name, data)
    return {f"kernel/precompiled/nvidia-precompiled-{release}": packed.getvalue(), **_CORES}


def signed_modules(version: str, release: str) -> dict[str, bytes]:
    """The modules Google signs: interface then binary core linked by `ld -d -r` (which
    FAKE_LD does by concatenation), uvm and drm as packed."""
    objs = _precompiled_objects(version, release)
    return {
        "nvidia.ko": objs["nv-linux.o"] + _CORES["kernel/nvidia/nv-kernel.o_binary"],
        "nvidia-modeset.ko": objs["nv-modeset-linux.o"]
        + _CORES["kernel/nvidia-modeset/nv-modeset-kernel.o_binary"],
        "nvidia-uvm.ko": objs["nvidia-uvm.ko"],
        "nvidia-drm.ko": objs["nvidia-drm.ko"],
    }


def custom_run(out_dir: Path, version: str, release: str = COS_KERNEL) -> Path:
    """NVIDIA-Linux-x86_64-<V>-custom.run: the driver package with precompiled kernel
    interfaces for one COS kernel and mkprecompiled (real makeself)."""
    files = {"mkprecompiled": MKPRECOMPILED.encode(), **precompiled_pieces(version, release)}
    return _wrapped_run(out_dir / f"NVIDIA-Linux-x86_64-{version}-custom.run", version, files)


def signature_tgz(path: Path, version: str, release: str = COS_KERNEL, *,
                  evil: str | None = None, modules: tuple[str, ...] = SIGNED_MODULES) -> Path:
    """nvidia-drivers-<V>-signature.tar.gz: <module>.sig per module (over the bytes of
    signed_modules) and pubkey.der; evil="dotdot" adds a member escaping the target."""
    linked = signed_modules(version, release)
    with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        for ko in modules:
            _add(tar, f"{ko}.sig", fake_pkcs7(linked[ko]))
        _add(tar, "pubkey.der", b"\x30\x82fake-gpu-key")
        if evil == "dotdot":
            _add(tar, "../../../../../../tmp/cos-evil-signature", "pwned")
        elif evil is not None:
            raise ValueError(evil)
    return path


WRAPPER = """#!/bin/sh
# Test wrapper: run the fake nvidia-installer, then append the environment it
# saw to its log (kept by the installer as <install-dir>/nvidia-installer.log).
here=$(cd "$(dirname "$0")" && pwd)
"$here/nvidia-installer.real" "$@"
rc=$?
log=/var/log/nvidia-installer.log
for a in "$@"; do case $a in --log-file-name=*) log=${a#*=} ;; esac; done
mkdir -p "$(dirname "$log")"
{
  echo "@BEGIN@"
  env | sort
  echo "=== CC --version ==="
  if [ -n "$CC" ]; then $CC --version 2>&1; else echo "(no CC)"; fi
  echo "=== ld ==="
  command -v ld && ld --version 2>&1 | head -1
  echo "=== end ==="
} >> "$log" 2>&1
exit $rc
""".replace("@BEGIN@", ENV_BEGIN)


def env_recording_run(out_dir: Path, version: str) -> Path:
    """NVIDIA-Linux-x86_64-<V>.run (real makeself) whose installer records its environment."""
    return _wrapped_run(out_dir / run_name(version), version, {})


def _wrapped_run(run: Path, version: str, extra: dict[str, bytes]) -> Path:
    """The fixture driver payload with WRAPPER around nvidia-installer, plus ``extra``
    files (relative path -> bytes; mkprecompiled is made executable), packed by makeself."""
    src = driver_payload(version, kernel_module_type_support=int(version.split(".")[0]) >= 550)
    work = Path(tempfile.mkdtemp(prefix="cos-run-"))
    try:
        payload = work / f"NVIDIA-Linux-x86_64-{version}"
        shutil.copytree(src, payload, symlinks=True)
        os.replace(payload / "nvidia-installer", payload / "nvidia-installer.real")
        (payload / "nvidia-installer").write_text(WRAPPER)
        (payload / "nvidia-installer").chmod(0o755)
        for rel, data in extra.items():
            (payload / rel).parent.mkdir(parents=True, exist_ok=True)
            (payload / rel).write_bytes(data)
        if "mkprecompiled" in extra:
            (payload / "mkprecompiled").chmod(0o755)
        return pack_run(payload, run, version, "--sha256")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def recorded_env(installer_log: str, begin: str = ENV_BEGIN) -> dict[str, str]:
    """The environment block the wrapper appended to nvidia-installer.log (or, with
    ``begin=runfile.KBUILD_ENV_BEGIN``, the one the fake kbuild printed to make's log)."""
    if begin not in installer_log:
        return {}
    block = installer_log.split(begin, 1)[1].split("=== CC --version ===", 1)[0]
    env = {}
    for line in block.strip().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            env[key] = value
    return env


@dataclass
class Bucket:
    """The artifacts of one COS build, staged in a directory first."""

    root: Path  # a scratch dir holding the files
    build_id: str = COS_BUILD_ID
    release: str = COS_KERNEL
    aliases: dict[str, str] = field(default_factory=lambda: dict(ALIASES))
    prebuilt_versions: tuple[str, ...] = ()
    toolchain_env: str | None = TOOLCHAIN_ENV
    toolchain_via_url: str | None = None  # write toolchain_url with this content instead
    evil_headers: str | None = None
    lld: str = FAKE_LD  # the toolchain's ld.lld (a script)
    # extensions/gpu/: NVIDIA-Linux-x86_64-<V>-custom.run (prebuilt by the caller,
    # see custom_run) and nvidia-drivers-<V>-signature.tar.gz per version.
    custom_runs: dict[str, Path] = field(default_factory=dict)
    signature_versions: tuple[str, ...] = ()
    evil_signatures: str | None = None
    # v2's layout, <BUILD_ID>/<board>/ (cos/tools src/pkg/cos/artifacts.go NewGCSDownloader):
    # "lakitu-arm64" for an Arm build's artifacts; None: the board-less <BUILD_ID>/.
    board: str | None = None

    @property
    def build_dir(self) -> Path:
        return self.root / self.build_id / (self.board or "")

    def write(self) -> Path:
        d = self.build_dir
        d.mkdir(parents=True, exist_ok=True)
        for alias, version in self.aliases.items():
            (d / f"gpu_{alias}_version").write_text(version + "\n")
        headers_tgz(d / "kernel-headers.tgz", self.release, evil=self.evil_headers)
        if self.toolchain_via_url is not None:
            (d / "toolchain_url").write_text(self.toolchain_via_url + "\n")
            toolchain_txz(self.root / "toolchain-elsewhere.tar.xz")
        else:
            toolchain_txz(d / "toolchain.tar.xz", lld=self.lld)
        if self.toolchain_env is not None:
            (d / "toolchain_env").write_text(self.toolchain_env)
        for version in self.prebuilt_versions:
            prebuilt_tgz(d / f"nvidia-drivers-{version}.tgz", version, self.release)
        ext = d / "extensions/gpu"
        for version, run in self.custom_runs.items():
            ext.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(run, ext / f"NVIDIA-Linux-x86_64-{version}-custom.run")
        for version in self.signature_versions:
            ext.mkdir(parents=True, exist_ok=True)
            signature_tgz(ext / f"nvidia-drivers-{version}-signature.tar.gz", version,
                          self.release, evil=self.evil_signatures)
        return d

    def file_url(self) -> str:
        """The artifacts URL template for file:// access."""
        return f"file://{self.root}/{self._template_path()}"

    def _template_path(self) -> str:
        return "{build_id}/{board}" if self.board else "{build_id}"

    def serve(self, server, prefix: str = "/cos-tools") -> str:
        """Serve the staged files; returns the artifacts URL template."""
        server.serve_tree(prefix, self.root)
        return f"{server.url}{prefix}/{self._template_path()}"
