"""Modules of the precompiled source: NVIDIA's precompiled kernel interfaces linked with
the build's toolchain, and Google's PKCS#7 signatures appended (as Google's installer)."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from installer.base.errors import BuildError, IntegrityError, ModuleLoadError, SecureBootError
from installer.distros.cos import toolchain
from installer.distros.cos.artifacts import custom_run_name, signatures_name
from installer.distros.cos.toolchain import BuildTools
from installer.driver import nvidia_run
from installer.host.runner import CommandError
from installer.jail import archive, harvest
from installer.kmod import modsign
from installer.kmod.modinfo import read_modinfo
from installer.plan import Step
from installer.records.results import (
    Extracted,
    Fetched,
    HeadersReady,
    PrebuiltReady,
    SignaturesUnpacked,
    Staged,
)
from installer.steps import activate

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)

# Modules the custom .run yields after linking; each needs <name>.sig.
PRECOMPILED_MODULES = ("nvidia.ko", "nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia-drm.ko")
# The modules linked here: (module, its kernel interface in kernel/precompiled/, its
# binary core), as cos-gpu-installer v2's linkDrivers (installer.go L214-236).
LINKED = (("nvidia.ko", "nv-linux.o", "nvidia/nv-kernel.o_binary"),
          ("nvidia-modeset.ko", "nv-modeset-linux.o", "nvidia-modeset/nv-modeset-kernel.o_binary"))
# How nvidia-installer links a precompiled interface with its core: `ld -d -r -o
# MODULE INTERFACE CORE` (NVIDIA/nvidia-installer kernel.c unpack_kernel_modules,
# nvidia-installer.h LD_OPTIONS), with the first `ld` on PATH (misc.c, find_system_util).
LEGACY_LD_OPTIONS = ("-d", "-r")
MAX_MODULE_BYTES = 1 << 30  # a signed nvidia.ko is ~100 MB


def unpack_signatures(version: str) -> Step:
    """Extract nvidia-drivers-<V>-signature.tar.gz safely (a tampered one is exit 6)."""

    def run(ctx: Context) -> SignaturesUnpacked:
        staging = ctx.results.staging()
        got = ctx.results.download("signatures")
        if got is None:
            raise LookupError("no step before unpack_signatures fetched the signatures")
        dest = staging.root / "signatures"
        label = signatures_name(version).rsplit("/", 1)[-1]
        archive.extract(got.path, dest, label=label)
        got.path.unlink(missing_ok=True)
        missing = [m for m in PRECOMPILED_MODULES if not _signature_file(dest, m).is_file()]
        if missing:
            raise IntegrityError(
                f"{label} has no signature for {', '.join(missing)}",
                hint="the artifact is incomplete; check the COS artifacts URL", url=got.url)
        return SignaturesUnpacked(dest)

    return Step("unpack_signatures", run,
                f"{signatures_name(version)} -> <staging>/signatures (safe extraction)",
                needs=(Staged, Fetched), gives=(SignaturesUnpacked,))


def _signature_file(root: Path, module: str) -> Path:
    return root / f"{module}.sig"


def link_precompiled(tools: BuildTools, env: dict[str, str], version: str) -> Step:
    """mkprecompiled --unpack, ld.lld -T module.lds for nvidia.ko and nvidia-modeset.ko,
    then each module + its PKCS#7 signature in the kernel's appended format, into
    <staging>/precompiled/drivers (placed into drivers/ after the user-space install)."""

    def run(ctx: Context) -> PrebuiltReady:
        staging = ctx.results.staging()
        extract = ctx.results.need(Extracted).extract_dir
        kernel_tree = ctx.results.need(HeadersReady).tree
        kernel_dir = extract / "kernel"
        pre_dir = kernel_dir / "precompiled"
        _check_dirs(extract)
        packed = sorted(p for p in pre_dir.iterdir() if p.is_file()) if pre_dir.is_dir() else []
        if not packed:
            raise BuildError(f"{custom_run_name(version)} holds no precompiled kernel interfaces "
                             "(kernel/precompiled is empty)", path=str(pre_dir))
        if len(packed) > 1:
            log.warning("precompiled_archives_several", names=[p.name for p in packed],
                        using=packed[-1].name)
        # scripts/module.lds is generated: it lives in the kbuild output dir.
        source: Path = kernel_tree.output
        script = next((source / "scripts" / n for n in ("module.lds", "module-common.lds")
                       if (source / "scripts" / n).is_file()), None)
        if script is None:
            raise BuildError(f"the kernel headers have no scripts/module.lds ({source})",
                             path=str(source), kernel_release=ctx.host_info.kernel_release)
        # The .run's own program: in the jail, like its header (docs/jail.md).
        tree = nvidia_run.EXTRACT_IN_CHROOT
        nvidia_run.run_tree_tool(
            ctx.runner, [f"{tree}/mkprecompiled", "--unpack",
                         f"{tree}/kernel/precompiled/{packed[-1].name}", "-o",
                         f"{tree}/kernel/precompiled"],
            "unpacking the precompiled driver (mkprecompiled)", extract_dir=extract,
            staging=staging)
        _check_dirs(extract)  # what it left: linked and read out here, outside the jail
        lld = toolchain.module_linker(tools.toolchain, env)
        _link(ctx, [str(lld), "-T", str(script), "-r"])
        for name in ("nvidia-uvm.ko", "nvidia-drm.ko"):  # shipped pre-linked
            if (pre_dir / name).is_file():
                os.replace(pre_dir / name, kernel_dir / name)
        out = staging.root / "precompiled" / "drivers"
        out.mkdir(parents=True, exist_ok=True)
        _sign(ctx, PRECOMPILED_MODULES, out, version)
        built = read_modinfo(out / "nvidia.ko").get("version")
        if built and built != version:
            raise IntegrityError(f"{custom_run_name(version)} holds nvidia.ko version {built}, "
                                 f"not {version}")
        log.info("precompiled_modules_linked", modules=list(PRECOMPILED_MODULES),
                 linker=str(lld), linker_script=str(script), signed=True)
        return PrebuiltReady(out.parent)

    return Step("link_precompiled", run,
                "mkprecompiled --unpack; ld.lld -T module.lds -r -o nvidia.ko / nvidia-modeset.ko; "
                "append Google's PKCS#7 signatures",
                needs=(Staged, Extracted, HeadersReady, SignaturesUnpacked), gives=(PrebuiltReady,))


def _check_dirs(extract: Path) -> None:
    """Exit 7 unless the dirs this step reads and links in, outside the jail, are real
    dirs of the extracted tree: a link the .run's code left there would send the linker's
    output or our reads to the host (installer/jail/harvest.py)."""
    for rel in ("kernel/precompiled", *(f"kernel/{core.rsplit('/', 1)[0]}"
                                        for _m, _i, core in LINKED)):
        try:
            os.close(harvest.open_dir(extract, rel))
        except FileNotFoundError:
            continue  # missing: the step's own checks name what is missing
        except harvest.Refused as exc:
            raise BuildError(f"the precompiled driver's tree is not as published: {exc}",
                             hint="check the COS artifacts (pin them with "
                             "--cos-artifacts-sha256)") from None


def _link(ctx: Context, linker: list[str]) -> None:
    """``linker -o kernel/<module> <interface> <core>`` for each of LINKED."""
    extract = ctx.results.need(Extracted).extract_dir
    kernel_dir = extract / "kernel"
    for module, interface, core in LINKED:
        argv = [*linker, "-o", str(kernel_dir / module),
                str(kernel_dir / "precompiled" / interface), str(kernel_dir / core)]
        try:
            ctx.runner.run(argv, cwd=extract)
        except CommandError as exc:
            raise BuildError(f"linking the precompiled {module} with {linker[0]} failed: {exc}",
                             kernel_release=ctx.host_info.kernel_release) from exc


def _sign(ctx: Context, modules: tuple[str, ...], out: Path, version: str) -> None:
    """kernel/<module> + its Google signature, in the kernel's appended format, to out/."""
    extract = ctx.results.need(Extracted).extract_dir
    sigs = ctx.results.need(SignaturesUnpacked).signatures_dir
    kernel_dir = extract / "kernel"
    for name in modules:
        ko = kernel_dir / name
        data = harvest.read_head(extract, f"kernel/{name}", MAX_MODULE_BYTES)
        if data is None:  # absent, or not a regular file (a link is never read)
            raise BuildError(f"{custom_run_name(version)} yielded no {name} (as a regular "
                             "file)", path=str(ko))
        try:
            signed = modsign.append_signature(data, _signature_file(sigs, name).read_bytes())
        except ValueError as exc:
            raise IntegrityError(f"cannot sign {name}: {exc}") from exc
        (out / name).write_bytes(signed)


def load_or_relink(version: str, display_modules: bool) -> Step:
    """Load the staged modules; if the kernel refuses the ld.lld-linked ones,
    link them again the legacy way and load once more, as cos-gpu-installer v2 does
    (cos/tools src/cmd/cos_gpu_installer/internal/: commands/install.go L391-400, on
    ErrDriverLoad RunDriverInstaller again with legacyLink; installer/installer.go
    L260-298, nvidia-installer then links with the container's GNU ld, because the
    signatures of some drivers match only that linker's output bit for bit).

    Both failing is exit 8 naming both attempts: the modules were signed by Google for
    this build, so a refused key here is a module that does not match, not a policy."""

    load = activate.load_modules(from_staging=True, display_modules=display_modules)
    unload_other = activate.unload_other_driver(version)

    def run(ctx: Context) -> None:
        try:
            load.run(ctx)
            return
        except (ModuleLoadError, SecureBootError) as exc:
            first = exc
        if ctx.results.get(Extracted) is None:
            raise first  # filled from the next-boot stage: no extracted .run to relink from
        ld = shutil.which("ld")
        log.warning("precompiled_load_failed", error=first.message, linker="ld.lld",
                    retry=f"relinking with {ld or 'GNU ld'} {' '.join(LEGACY_LD_OPTIONS)} "
                    "(legacy linking) and loading once more")
        try:
            if ld is None:
                raise BuildError("no `ld` on PATH for the legacy link (the image needs binutils)")
            _link(ctx, [ld, *LEGACY_LD_OPTIONS])
            _sign(ctx, tuple(m for m, *_ in LINKED), ctx.results.staging().drivers, version)
            unload_other.run(ctx)
            load.run(ctx)
        except (BuildError, IntegrityError, ModuleLoadError, SecureBootError) as second:
            raise ModuleLoadError(
                "the precompiled modules did not load, neither linked with ld.lld "
                f"({first.message}) nor relinked with GNU ld ({second.message})",
                hint="the -custom.run and signatures of this COS build do not match its kernel; "
                "try another --driver-version, or see the kernel log (dmesg)",
                kernel_release=ctx.host_info.kernel_release,
            ) from second
        log.info("precompiled_loaded_after_legacy_link", linker=ld)

    return replace(load, run=run, detail=f"{load.detail}; if the kernel refuses them: relink "
                   f"nvidia.ko and nvidia-modeset.ko with GNU ld {' '.join(LEGACY_LD_OPTIONS)} "
                   "(legacy, as cos-gpu-installer v2) and load once more")
