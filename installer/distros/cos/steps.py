"""The COS-only steps: the signing check, kernel headers and toolchain from the tools
cache, and the prebuilt modules."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from installer.base.errors import BuildError, IntegrityError, SecureBootError
from installer.base.fsutil import remove_tree
from installer.distros.cos import toolchain
from installer.distros.cos.artifacts import KERNEL_HEADERS, prebuilt_modules_name
from installer.distros.cos.toolchain import BuildTools
from installer.jail import archive
from installer.jail.run_in_jail import SANDBOX_PATH
from installer.kmod import headers, signing
from installer.kmod.modinfo import read_modinfo
from installer.plan import Step
from installer.records.results import (
    BuildToolchain,
    Fetched,
    GpusChecked,
    HeadersReady,
    PrebuiltReady,
    Staged,
    StepResult,
    ToolchainReady,
)
from installer.steps import checks

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)


def check_gpus(version: str, requested: str, module_type: str | None) -> Step:
    """The shared GPU check; the module type we know (prebuilt, or what the .cache records) is what
    gets reported, not the one a compile would pick."""
    inner = checks.check_gpus(version, requested)

    def run(ctx: Context) -> StepResult | None:
        checked = inner.run(ctx)
        if module_type and isinstance(checked, GpusChecked):
            return replace(checked, module_type=module_type)
        return checked

    return replace(inner, run=run)


def check_signing(policy_note: str, *, prebuilt: bool, version: str, build_id: str,
                  prebuilt_url: str, unusable: tuple[str, ...] = (),
                  signatures_url: str | None = None, signed_what: str = "signed prebuilt modules",
                  ) -> Step:
    """Exit 10 before any big download when the modules we would use cannot load."""

    def run(ctx: Context) -> None:
        policy = signing.policy(ctx.kernel)
        if policy.loadpin_blocks:
            raise SecureBootError(
                "LoadPin is enforced for kernel modules (loadpin.enforce=1 without "
                "loadpin.exclude=kernel-module): no module from the install dir can load",
                hint="use a COS image whose kernel command line has "
                "loadpin.exclude=kernel-module (current COS images do); this installer "
                "never edits boot config or reboots",
                kernel_release=ctx.host_info.kernel_release,
            )
        if policy.enforced and not prebuilt:
            why = (f"the signed prebuilt modules of COS build {build_id} cannot be used here: "
                   + "; ".join(unusable)) if unusable else (
                   f"COS build {build_id} offers no signed prebuilt modules for driver "
                   f"{version} ({prebuilt_url} not found)")
            if signatures_url:
                why += (f", nor a signed precompiled driver for these GPUs "
                        f"({signatures_url} and its -custom.run)")
            raise signing.refusal(
                policy, f"{why}; compiled modules would be rejected",
                "choose a driver version this build ships prebuilt modules for "
                "(--driver-version=default or latest usually do)",
                url=prebuilt_url, kernel_release=ctx.host_info.kernel_release, build_id=build_id)
        if policy.enforced:
            log.info("module_signing_enforced", reasons=list(policy.reasons),
                     using=signed_what)

    return Step("check_module_signing", run, policy_note, check=True)


def prepare_kernel_headers(tools: BuildTools, release: str,
                           preset: headers.KernelTree | None) -> Step:
    def run(ctx: Context) -> HeadersReady:
        if preset is not None:
            return HeadersReady(preset)
        got = ctx.results.download("headers")
        if got is not None:
            toolchain.install_archive(got.path, tools.headers, source_url=got.url,
                                      sha256=got.sha256, label=KERNEL_HEADERS)
        elif not tools.headers_ready():
            raise BuildError(f"kernel headers missing from {tools.headers}", path=str(tools.headers))
        tree = toolchain.find_kernel_tree(tools.headers, release)
        log.info("kernel_headers_ready", path=str(tree), cached=got is None)
        return HeadersReady(headers.KernelTree(tree, tree))

    where = preset.describe() if preset else f"{tools.headers} (safe extraction, reused when present)"
    return Step("prepare_kernel_headers", run, where, gives=(HeadersReady,))


def prepare_toolchain(tools: BuildTools, env: dict[str, str]) -> Step:
    def run(ctx: Context) -> ToolchainReady:
        got = ctx.results.download("toolchain")
        if got is not None:
            toolchain.install_archive(got.path, tools.toolchain, source_url=got.url,
                                      sha256=got.sha256, label="COS toolchain",
                                      exclude_patterns=toolchain.TOOLCHAIN_EXCLUDES)
        elif not tools.toolchain_ready(env["CC"]):
            raise BuildError(f"toolchain missing from {tools.toolchain}", path=str(tools.toolchain))
        toolchain.ensure_exec(tools.root, ctx.runner)
        linker = toolchain.link_ld(tools.toolchain, env)
        toolchain.check_compiler(tools.toolchain, env)
        ready = BuildToolchain(
            toolchain.compile_env(tools.toolchain, env, SANDBOX_PATH),
            # The sandbox is an overlay of the container's root: a separately mounted
            # tools dir (/build/cos-tools) must be bound into it.
            binds=((str(tools.root), str(tools.root)),))
        toolchain.prune_other_builds(tools.tools_dir, tools.build_id)
        log.info("toolchain_ready", path=str(tools.toolchain), cc=env.get("CC"),
                 cxx=env.get("CXX"), ld=str(linker) if linker else None, cached=got is None)
        return ToolchainReady(ready)

    return Step("prepare_toolchain", run,
                f"{tools.toolchain}: CC={env.get('CC')} CXX={env.get('CXX')}, bin/ first on PATH, "
                "bin/ld -> cross linker (reused when present)", gives=(ToolchainReady,))


def unpack_prebuilt(version: str) -> Step:
    """Extract nvidia-drivers-<V>.tgz safely into the staging area and check it."""

    def run(ctx: Context) -> PrebuiltReady:
        staging = ctx.results.staging()
        got = ctx.results.download("prebuilt")
        if got is None:
            raise LookupError("no step before unpack_prebuilt fetched the prebuilt modules")
        dest = staging.root / "prebuilt"
        archive.extract(got.path, dest, label=prebuilt_modules_name(version), keep_xattrs=True)
        got.path.unlink(missing_ok=True)
        modules = prebuilt_modules(dest)
        if "nvidia.ko" not in modules:
            raise IntegrityError(
                f"{prebuilt_modules_name(version)} holds no nvidia.ko",
                hint="the artifact is incomplete; check the COS artifacts URL",
                url=got.url,
            )
        built = read_modinfo(modules["nvidia.ko"]).get("version")
        if built and built != version:
            raise IntegrityError(
                f"{prebuilt_modules_name(version)} holds nvidia.ko version {built}, not {version}",
                url=got.url,
            )
        log.info("prebuilt_modules_unpacked", modules=sorted(modules), version=version)
        return PrebuiltReady(dest)

    return Step("unpack_prebuilt", run, f"{prebuilt_modules_name(version)} -> <staging>/prebuilt "
                "(safe extraction, xattrs kept)", needs=(Staged, Fetched), gives=(PrebuiltReady,))


def prebuilt_modules(root: Path) -> dict[str, Path]:
    preferred = {p.name: p for p in sorted((root / "drivers").glob("*.ko")) if not p.is_symlink()}
    if preferred:
        return preferred
    return {p.name: p for p in sorted(root.rglob("*.ko")) if not p.is_symlink()}


def place_prebuilt() -> Step:
    """After the user-space install: the signed modules into drivers/, firmware merged in."""

    def run(ctx: Context) -> None:
        staging = ctx.results.staging()
        src = ctx.results.need(PrebuiltReady).prebuilt_dir
        for name, path in prebuilt_modules(src).items():
            os.chmod(path, 0o644)
            os.replace(path, staging.drivers / name)
        firmware = src / "firmware"
        if firmware.is_dir():
            for dirpath, _dirs, files in os.walk(firmware):
                rel = Path(dirpath).relative_to(firmware)
                (staging.firmware / rel).mkdir(parents=True, exist_ok=True)
                for f in files:
                    os.replace(Path(dirpath) / f, staging.firmware / rel / f)
        remove_tree(src, ignore_errors=True)

    return Step("place_prebuilt", run, "<staging>/prebuilt -> drivers/ and firmware/",
                needs=(Staged, PrebuiltReady))


def preload_finished(tools: BuildTools) -> Step:
    def run(ctx: Context) -> None:
        log.info("preload_done", tools_dir=str(tools.root),
                 toolchain=str(tools.toolchain), kernel_headers=str(tools.headers))

    return Step("preload_finished", run, f"toolchain and headers cached in {tools.root}")
