"""``bundle build``: the install's own build steps, then the staged tree packed as a bundle.

Nothing is loaded and the host's install dir is not touched: the build runs in
a work dir under the output dir, through the same find-headers / download /
extract / nvidia-installer-in-the-sandbox steps as ``install`` (so a bundle
holds exactly what a compiled install would), for the kernel given by
``--kernel-release`` (default: the running one) and the architecture given by
``--arch`` (default: this machine's). Another architecture's bundle is cross-compiled:
Kbuild's ``ARCH=arm64 CROSS_COMPILE=aarch64-linux-gnu-`` against that architecture's
headers, and the .run's nvidia-installer (the target's binary) run through
binfmt_misc (qemu-user-static).
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
import zstandard

from installer import __version__
from installer.base import cpuarch
from installer.base.cpuarch import CpuArch
from installer.base.dataclass import dataclass
from installer.base.errors import BuildError, UnsupportedHostError
from installer.base.fsutil import sha256_file, write_atomic
from installer.bundle import tree
from installer.distros.flows import for_host
from installer.distros.headers_build_flow import HeadersBuildFlow, compile_steps
from installer.host.installdir import LAYOUT_DIRS
from installer.host.runner import CommandError
from installer.kmod.modinfo import read_modinfo, vermagic_release
from installer.kmod.modsign import MAGIC
from installer.plan import Plan, Step
from installer.records.bundle_manifest import (
    MANIFEST_NAME,
    BundleError,
    BundleKey,
    Manifest,
    Written,
    check_link,
)
from installer.records.results import BundleWritten, HeadersReady, Staged, ToolchainReady
from installer.steps import staging

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)

# zstd level (bench/bundle_codec.py on the real 535 bundle, 197 MB of tar): 19 is the
# smallest (96.5 MB; 100 MB at 10, 104.5 at 3, gzip -6 110) and decompresses no slower --
# every node gains; the build pays once (~2 min on 2 CPUs, against a ~4-7 min build).
COMPRESS_LEVEL = 19
SIGN_TIMEOUT_S = 120


@dataclass(frozen=True)
class Signing:
    key: Path  # private key (PEM), as the kernel's scripts/sign-file takes it
    cert: Path  # X.509 certificate enrolled on the nodes (MOK / db)


def plan(ctx: Context, output_dir: Path, signing: Signing | None, *,
         level: int = COMPRESS_LEVEL) -> Plan:
    distro = for_host(ctx.host_info)  # its version, module type and kernel headers
    if not isinstance(distro, HeadersBuildFlow):
        raise UnsupportedHostError(
            f"bundle build compiles against kernel headers; {distro.title} installs otherwise",
            hint="run it where the headers-built distros run (e.g. the bundle-job's image)")
    version = distro.driver_version(ctx)
    key = BundleKey(version, ctx.host_info.kernel_release, distro.module_type(ctx, version))
    url = ctx.settings.driver_run_url(version, arch=ctx.arch.nvidia)
    cross = cross_target(ctx)
    return Plan("bundle", (
        distro.headers_step(),
        staging.prepare_staging(),
        *compile_steps(ctx, url, version, key.module_type, cross=cross),
        *((sign_modules(signing),) if signing else ()),
        write_bundle(key, output_dir, signed=signing is not None, cross=cross, level=level),
    ), driver_version=version, kernel_module_type=key.module_type, driver_url=url,
        driver_sha256=ctx.settings.driver_sha256,
        display={"kernel_release": key.kernel_release, "bundle": key.name(),
                 "arch": ctx.arch.machine, "cross_compiled": cross is not None})


def cross_target(ctx: Context) -> CpuArch | None:
    """The bundle's architecture (``--arch``, carried in ``ctx.arch``) when this build
    machine's (``uname -m``: the compilers' own) is another: Kbuild then cross-compiles."""
    build_machine = cpuarch.from_machine(ctx.kernel.machine())
    return None if ctx.arch == build_machine else ctx.arch


def sign_modules(signing: Signing) -> Step:
    """Each module signed with the kernel's own ``scripts/sign-file`` from its headers."""

    def run(ctx: Context) -> None:
        kernel_tree = ctx.results.need(HeadersReady).tree
        tool = next((p for p in (kernel_tree.output / "scripts/sign-file",
                                 kernel_tree.source / "scripts/sign-file") if p.is_file()), None)
        if tool is None:
            raise BuildError(f"no scripts/sign-file in the kernel headers {kernel_tree.describe()}",
                             hint="install the full linux-headers package of the kernel")
        staging = ctx.results.staging()
        for ko in sorted(staging.drivers.glob("*.ko")):
            try:
                ctx.runner.run([tool, "sha256", signing.key, signing.cert, ko],
                               timeout=SIGN_TIMEOUT_S)
            except CommandError as exc:
                raise BuildError(f"sign-file failed for {ko.name}: {exc.stderr_tail(2)}",
                                 hint="check --signing-key and --signing-cert are a matching "
                                 "PEM key and X.509 certificate", path=str(ko)) from exc
            if not _signed(ko):
                raise BuildError(f"sign-file left {ko.name} without a signature", path=str(ko))
        log.info("modules_signed", cert=str(signing.cert))

    return Step("sign_modules", run, f"<headers>/scripts/sign-file sha256 {signing.key} "
                f"{signing.cert} <each .ko>", needs=(Staged, HeadersReady))


def _signed(ko: Path) -> bool:
    with open(ko, "rb") as f:
        f.seek(max(0, ko.stat().st_size - len(MAGIC)))
        return f.read() == MAGIC


def write_bundle(key: BundleKey, output_dir: Path, *, signed: bool,
                 cross: CpuArch | None = None, level: int = COMPRESS_LEVEL) -> Step:
    def run(ctx: Context) -> BundleWritten:
        staging = ctx.results.staging()
        manifest = make_manifest(staging.root, key, compiler=compiler_version(ctx, cross),
                                 signed=signed, driver_sha256=_run_sha256(ctx),
                                 arch=ctx.arch)
        return BundleWritten(write(staging.root, manifest, output_dir, level=level))

    return Step("write_bundle", run, f"{output_dir}/{key.name()} and its .sha256",
                needs=(Staged,), gives=(BundleWritten,))


def _run_sha256(ctx: Context) -> str | None:
    got = ctx.results.download("driver")
    return got.sha256 if got is not None else None


def compiler_version(ctx: Context, cross: CpuArch | None = None) -> str:
    """The first line of ``$CC --version``: the compiler the sandboxed build ran (a cross
    build's: Kbuild's ``$(CROSS_COMPILE)gcc``)."""
    ready = ctx.results.get(ToolchainReady)
    toolchain_cc = ready.toolchain.env.get("CC") if ready else None
    cross_cc = f"{cross.cross_prefix}gcc" if cross else None
    cc = toolchain_cc or cross_cc or os.environ.get("CC") or "cc"
    try:
        out = ctx.runner.run([cc.split()[0], "--version"], timeout=30).stdout
    except (CommandError, OSError):
        return "unknown"
    return (out.splitlines() or ["unknown"])[0].strip()[:200] or "unknown"


def make_manifest(root: Path, key: BundleKey, *, compiler: str, signed: bool,
                  driver_sha256: str | None, arch: CpuArch = cpuarch.X86_64) -> Manifest:
    try:
        files, links = tree.describe(root)
        for rel, target in links.items():
            check_link(rel, target)
    except BundleError as exc:
        raise BuildError(f"the built tree cannot be bundled: {exc}", path=str(root)) from None
    modules = sorted((root / "drivers").glob("*.ko"))
    if not (root / "drivers/nvidia.ko").is_file():
        raise BuildError("the build produced no drivers/nvidia.ko", path=str(root))
    for ko in modules:
        with open(ko, "rb") as f:
            machine = cpuarch.elf_arch(f.read(cpuarch.ELF_HEAD_BYTES))
        if machine != arch:
            raise BuildError(f"{ko.name} is built for {machine or 'an unknown machine'}, "
                             f"not {arch}", hint="check --arch and the kernel headers' "
                             "architecture", path=str(ko))
        built_for = vermagic_release(read_modinfo(ko))
        if built_for != key.kernel_release:
            raise BuildError(f"{ko.name} was built for kernel {built_for}, not {key.kernel_release}",
                             hint="the kernel headers do not match --kernel-release",
                             path=str(ko))
    return Manifest(
        key=key, vermagic=read_modinfo(root / "drivers/nvidia.ko")["vermagic"],
        compiler=compiler, signed=signed,
        built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        installer_version=__version__, driver_sha256=driver_sha256, files=files, links=links,
        arch=arch.machine)


def write(root: Path, manifest: Manifest, output_dir: Path, *,
          level: int = COMPRESS_LEVEL) -> Written:
    """``<output_dir>/<name>``: manifest.json first (``bundle index`` reads only that), then
    the layout dirs; owned by root, one timestamp; then ``<name>.sha256`` beside it.
    ``level``: zstd's (the format is the same at every level)."""
    name = manifest.key.name()
    output_dir.mkdir(parents=True, exist_ok=True)
    final, part = output_dir / name, output_dir / f".{name}.part"
    mtime = int(time.time())

    def normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = mtime
        return info

    data = manifest.to_json().encode()
    # Every core compresses (one frame; threads only split the work).
    zstd = zstandard.ZstdCompressor(level=level, threads=-1, write_checksum=True)
    try:
        with (open(part, "wb") as raw, zstd.stream_writer(raw, closefd=False) as out,
              tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar):
            info = normalize(tarfile.TarInfo(MANIFEST_NAME))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
            for top in LAYOUT_DIRS:
                if (root / top).is_dir():
                    tar.add(root / top, arcname=top, filter=normalize)
        sha = sha256_file(part)
        os.replace(part, final)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    write_atomic(output_dir / f"{name}.sha256", f"{sha}  {name}\n")
    log.info("bundle_written", path=str(final), sha256=sha, size=final.stat().st_size,
             files=len(manifest.files), links=len(manifest.links))
    return Written(final, sha, manifest)
