"""The precompiled-signed flavour: NVIDIA's precompiled kernel interfaces linked with
the build's toolchain, and Google's PKCS#7 signatures appended (as Google's installer)."""

from __future__ import annotations

import os
from pathlib import Path

import structlog

from installer import archive, modsign
from installer.context import Context
from installer.distros.cos import toolchain
from installer.distros.cos.artifacts import custom_run_name, signatures_name
from installer.distros.cos.toolchain import BuildTools
from installer.errors import BuildError, IntegrityError
from installer.fsutil import remove_tree
from installer.modinfo import read_modinfo
from installer.plan import Step

log = structlog.get_logger(__name__)

# Modules the custom .run yields after linking; each needs <name>.sig.
PRECOMPILED_MODULES = ("nvidia.ko", "nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia-drm.ko")


def unpack_signatures(version: str) -> Step:
    """Extract nvidia-drivers-<V>-signature.tar.gz safely (a tampered one is exit 6)."""

    def run(ctx: Context) -> None:
        staging = ctx.work.staged()
        got = ctx.work.downloads["signatures"]
        dest = staging.root / "signatures"
        label = signatures_name(version).rsplit("/", 1)[-1]
        archive.extract(got.path, dest, label=label)
        got.path.unlink(missing_ok=True)
        missing = [m for m in PRECOMPILED_MODULES if not _signature_file(dest, m).is_file()]
        if missing:
            raise IntegrityError(
                f"{label} has no signature for {', '.join(missing)}",
                hint="the artifact is incomplete; check the COS artifacts URL", url=got.url)
        ctx.work.signatures_dir = dest

    return Step("unpack_signatures", run,
                f"{signatures_name(version)} -> <staging>/signatures (safe extraction)")


def _signature_file(root: Path, module: str) -> Path:
    return root / f"{module}.sig"


def link_precompiled(tools: BuildTools, env: dict[str, str], version: str) -> Step:
    """mkprecompiled --unpack, ld.lld -T module.lds for nvidia.ko and nvidia-modeset.ko,
    then each module + its PKCS#7 signature in the kernel's appended format, into
    <staging>/precompiled/drivers (placed into drivers/ after the user-space install)."""

    def run(ctx: Context) -> None:
        from installer.runner import CommandError

        staging = ctx.work.staged()
        extract: Path = ctx.work.extract_dir
        kernel_dir = extract / "kernel"
        pre_dir = kernel_dir / "precompiled"
        packed = sorted(p for p in pre_dir.iterdir() if p.is_file()) if pre_dir.is_dir() else []
        if not packed:
            raise BuildError(f"{custom_run_name(version)} holds no precompiled kernel interfaces "
                             "(kernel/precompiled is empty)", path=str(pre_dir))
        if len(packed) > 1:
            log.warning("precompiled_archives_several", names=[p.name for p in packed],
                        using=packed[-1].name)
        # scripts/module.lds is generated: it lives in the kbuild output dir.
        source: Path = ctx.work.kernel_tree.output
        script = next((source / "scripts" / n for n in ("module.lds", "module-common.lds")
                       if (source / "scripts" / n).is_file()), None)
        if script is None:
            raise BuildError(f"the kernel headers have no scripts/module.lds ({source})",
                             path=str(source), kernel_release=ctx.host_info.kernel_release)
        lld = toolchain.module_linker(tools.toolchain, env)
        commands = [
            [extract / "mkprecompiled", "--unpack", packed[-1], "-o", pre_dir],
            [lld, "-T", script, "-r", "-o", kernel_dir / "nvidia.ko",
             pre_dir / "nv-linux.o", kernel_dir / "nvidia" / "nv-kernel.o_binary"],
            [lld, "-T", script, "-r", "-o", kernel_dir / "nvidia-modeset.ko",
             pre_dir / "nv-modeset-linux.o",
             kernel_dir / "nvidia-modeset" / "nv-modeset-kernel.o_binary"],
        ]
        for argv in commands:
            try:
                ctx.runner.run(argv, cwd=extract)
            except CommandError as exc:
                raise BuildError(f"linking the precompiled driver failed: {exc}",
                                 kernel_release=ctx.host_info.kernel_release) from exc
        for name in ("nvidia-uvm.ko", "nvidia-drm.ko"):  # shipped pre-linked
            if (pre_dir / name).is_file():
                os.replace(pre_dir / name, kernel_dir / name)
        sigs: Path = ctx.work.signatures_dir
        out = staging.root / "precompiled" / "drivers"
        out.mkdir(parents=True, exist_ok=True)
        for name in PRECOMPILED_MODULES:
            ko = kernel_dir / name
            if not ko.is_file():
                raise BuildError(f"{custom_run_name(version)} yielded no {name}", path=str(ko))
            try:
                signed = modsign.append_signature(ko.read_bytes(),
                                                  _signature_file(sigs, name).read_bytes())
            except ValueError as exc:
                raise IntegrityError(f"cannot sign {name}: {exc}") from exc
            (out / name).write_bytes(signed)
        built = read_modinfo(out / "nvidia.ko").get("version")
        if built and built != version:
            raise IntegrityError(f"{custom_run_name(version)} holds nvidia.ko version {built}, "
                                 f"not {version}")
        remove_tree(sigs, ignore_errors=True)
        ctx.work.prebuilt_dir = out.parent
        log.info("precompiled_modules_linked", modules=list(PRECOMPILED_MODULES),
                 linker=str(lld), linker_script=str(script), signed=True)

    return Step("link_precompiled", run,
                "mkprecompiled --unpack; ld.lld -T module.lds -r -o nvidia.ko / nvidia-modeset.ko; "
                "append Google's PKCS#7 signatures")
