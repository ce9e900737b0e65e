"""Container-Optimized OS: prebuilt signed modules when the build has them, else a build
with the build's own kernel headers and cross toolchain.

Decisions are made when the plan is built (it may read the build's small
metadata files: version aliases, ``toolchain_url``, ``toolchain_env``, and
probe whether prebuilt modules exist); big artifacts are fetched by steps, in
parallel, only after the signature policy allowed it.

- **prebuilt** (``nvidia-drivers-<V>.tgz`` exists, preferred): its signed (open)
  modules go into ``drivers/`` and the NVIDIA installer runs for user space
  only (``--no-kernel-module``). Flavour ``prebuilt-open``.
- **precompiled-signed** (signatures enforced, no usable prebuilt modules, and the
  build has ``extensions/gpu/NVIDIA-Linux-x86_64-<V>-custom.run`` and
  ``nvidia-drivers-<V>-signature.tar.gz``): as Google's installer, link
  ``nvidia.ko``/``nvidia-modeset.ko`` from NVIDIA's precompiled kernel interfaces
  with the toolchain's ``ld.lld -T module.lds``, append Google's PKCS#7
  signatures, user space with ``--no-kernel-module``. Proprietary modules
  (pre-Turing GPUs: P4, P100, V100, K80). Flavour ``precompiled-signed``.
- **compiled**: ``kernel-headers.tgz`` and the toolchain, cached on the host
  under the tools dir, then the shared nvidia-installer build with
  ``--kernel-source-path`` and the toolchain's CC/CXX/PATH. Flavour
  ``compiled-proprietary``. Refused with exit 10 before any big download if
  the kernel only loads signed modules.
- **cached**: same build, version and intact files: load and verify.
- **preload** (``--preload``): fetch and cache the toolchain and headers only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

import structlog

from installer import archive, cache, headers, modsign, pins, steps, toolchain
from installer.cache import CacheKey
from installer.context import Context
from installer.cos_artifacts import (
    DEFAULT_ALIAS,
    KERNEL_HEADERS,
    LATEST_ALIAS,
    TOOLCHAIN_ENV_FILE,
    TOOLCHAIN_URL_FILE,
    Artifacts,
    MissingArtifactError,
    Requested,
    Resolved,
    artifacts_base,
    custom_run_name,
    parse_requested,
    parse_toolchain_env,
    prebuilt_modules_name,
    signatures_name,
    toolchain_location,
)
from installer.distros.base import Distro
from installer.errors import BuildError, DownloadError, IntegrityError, SecureBootError
from installer.installdir import Tree
from installer.kernel import KernelState, cmdline_enforces_signatures
from installer.modinfo import read_modinfo
from installer.nvidia_run import driver_url
from installer.plan import Plan, Step
from installer.toolchain import BuildTools
from installer.urls import artifacts_root, check_url_scheme

if TYPE_CHECKING:
    from installer.retry import RetryPolicy

log = structlog.get_logger(__name__)

FLAVOR_PREBUILT = "prebuilt-open"
FLAVOR_COMPILED = "compiled-proprietary"  # "compiled-open" when the open modules are built
FLAVOR_PRECOMPILED = "precompiled-signed"  # proprietary modules linked here, Google-signed
# Modules the custom .run yields after linking; each needs <name>.sig.
PRECOMPILED_MODULES = ("nvidia.ko", "nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia-drm.ko")


def quick_policy() -> RetryPolicy:
    """When a cached install of this build exists, an unreachable artifacts server
    should not hold up the restart for the full download policy."""
    from installer.retry import RetryPolicy

    return RetryPolicy(attempts=2, wait_initial=1.0, wait_max=2.0, total_timeout=20.0,
                       connect_timeout=5.0, read_timeout=10.0)


# --------------------------------------------------------------------------- kernel policy


@dataclass(frozen=True)
class SigningPolicy:
    reasons: tuple[str, ...]  # why only signed modules load (empty: unsigned ones load)
    loadpin_blocks: bool  # LoadPin refuses modules from outside the root filesystem

    @property
    def enforced(self) -> bool:
        return bool(self.reasons)


def signing_policy(kernel: KernelState) -> SigningPolicy:
    reasons = []
    cmdline = kernel.cmdline()
    if cmdline_enforces_signatures(cmdline):
        reasons.append("module.sig_enforce=1 is on the kernel command line")
    elif kernel.signatures_enforced():
        reasons.append("/sys/module/module/parameters/sig_enforce is Y")
    lockdown = kernel.lockdown()
    if lockdown != "none":
        reasons.append(f"kernel lockdown is {lockdown!r}")
    words = cmdline.split()
    excluded = any(
        w.startswith("loadpin.exclude=") and "kernel-module" in w.partition("=")[2].split(",")
        for w in words
    )
    return SigningPolicy(tuple(reasons), "loadpin.enforce=1" in words and not excluded)


@dataclass(frozen=True)
class ModuleDecision:
    use_prebuilt: bool
    compiled_type: str  # what a compile builds: "open" or "proprietary"
    notes: tuple[str, ...] = ()


def decide_modules(gpus_found: list, version: str, requested: str,
                   prebuilt_available: bool) -> ModuleDecision:
    """Prebuilt (open, signed) modules when the build has them, every GPU here can use
    the open modules and the open flavour was not refused; else what a compile builds
    (the shared choice: the GPUs' needs, then NVIDIA's default for the branch).

    COS prefers its prebuilt modules whenever they can work, as Google's
    installer does; ``--kernel-module-type proprietary`` opts out of them.
    """
    from installer import gpus

    notes: list[str] = []
    legacy = [g for g in gpus_found if g.model and g.model.open_modules == "no"]
    use_prebuilt = prebuilt_available and requested != "proprietary" and not legacy
    if prebuilt_available and legacy:
        notes.append(f"prebuilt modules are open modules, which {legacy[0].name} "
                     f"({legacy[0].model.arch}) cannot use")
    if prebuilt_available and requested == "proprietary":
        notes.append("prebuilt modules are open modules: not used (--kernel-module-type "
                      "proprietary)")
    choice = gpus.choose_module_type(gpus_found, version, requested)
    return ModuleDecision(use_prebuilt, choice.module_type, tuple(notes))


def proprietary_allowed(gpus_found: list, requested: str) -> bool:
    """The proprietary modules (all the precompiled .run has) can drive these GPUs and were
    not refused (Blackwell and Grace Hopper need the open ones)."""
    return requested != "open" and not any(
        g.model and g.model.open_modules == "required" for g in gpus_found)


def fallback_alias(gpus_found: list, version: str) -> list[str]:
    """Branch aliases (newest first) to try when ``version`` cannot drive these GPUs
    (K80 on a build whose default is R535: R470), as Google's installer falls back."""
    from installer import gpus

    if not gpus.branch_problems(gpus_found, version):
        return []
    branches = [gpus.branch_of(v) for v in gpus.FALLBACK_VERSIONS]
    return [f"R{b}" for b in branches
            if b is not None and not gpus.branch_problems(gpus_found, f"{b}.0")]


# --------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class Fetch:
    fact: str  # ctx.facts key receiving the Downloaded result
    url: str
    where: str  # "staging" (the install dir's .staging) or "tools" (the build tools dir)
    label: str
    sha256: str | None = None


def _file_name(url: str, fallback: str) -> str:
    name = unquote(urlsplit(url).path).rstrip("/").rsplit("/", 1)[-1]
    return name if name and name not in (".", "..") else fallback


def fetch_artifacts(fetches: tuple[Fetch, ...], tools: BuildTools | None) -> Step:
    """Download everything the plan needs at once (download_all: parallel, first failure
    cancels the rest)."""

    def run(ctx: Context) -> None:
        from installer.download import DownloadJob, download_all

        if tools is not None and any(f.where == "tools" for f in fetches):
            # Archives a killed run left (extracted trees are kept only when complete);
            # a failing run removes its own.
            archive.remove_tree(tools.downloads)
            ctx.scratch.append(tools.downloads)
        jobs = []
        for f in fetches:
            if f.where == "staging":
                staging: Tree = ctx.facts["staging"]
                base = staging.root / "downloads"
            else:
                assert tools is not None
                base = tools.downloads
            jobs.append(DownloadJob(
                url=f.url, dest=base / _file_name(f.url, f.label), expected_sha256=f.sha256,
                label=f.label, allow_insecure_http=ctx.settings.allow_insecure_http,
            ))
        results = download_all(ctx.http, jobs)
        for f, result in zip(fetches, results, strict=True):
            ctx.facts[f.fact] = result
        if "driver_download" in ctx.facts:
            ctx.facts["run_file"] = ctx.facts["driver_download"].path
            ctx.facts["run_sha256"] = ctx.facts["driver_download"].sha256

    detail = "in parallel: " + ", ".join(f.url for f in fetches)
    return Step("fetch_artifacts", run, detail)


def check_gpus(version: str, requested: str, module_type: str | None) -> Step:
    """The shared GPU check; the module type we know (prebuilt or cached flavour) is what
    gets reported, not the one a compile would pick."""
    inner = steps.check_gpus(version, requested)

    def run(ctx: Context) -> None:
        inner.run(ctx)
        if module_type:
            ctx.facts["kernel_module_type"] = module_type

    return Step(inner.name, run, inner.detail)


def _flavor_module_type(flavor: str | None) -> str | None:
    if flavor == FLAVOR_PRECOMPILED:
        return "proprietary"
    return flavor.rsplit("-", 1)[-1] if flavor and flavor.count("-") == 1 else None


def check_signing(policy_note: str, *, prebuilt: bool, version: str, build_id: str,
                  prebuilt_url: str, unusable: tuple[str, ...] = (),
                  signatures_url: str | None = None, signed_what: str = "signed prebuilt modules",
                  ) -> Step:
    """Exit 10 before any big download when the modules we would use cannot load."""

    def run(ctx: Context) -> None:
        policy = signing_policy(ctx.kernel)
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
            raise SecureBootError(
                f"this node only loads signed kernel modules ({'; '.join(policy.reasons)}) "
                f"and {why}; compiled modules would be rejected",
                hint="choose a driver version this build ships prebuilt modules for "
                "(--driver-version=default or latest usually do), or run on a node pool "
                "without module signature enforcement; this installer never edits boot "
                "config or reboots",
                url=prebuilt_url,
                kernel_release=ctx.host_info.kernel_release,
                build_id=build_id,
            )
        if policy.enforced:
            log.info("module_signing_enforced", reasons=list(policy.reasons),
                     using=signed_what)

    return Step("check_module_signing", run, policy_note)


def prepare_kernel_headers(tools: BuildTools, release: str,
                           preset: headers.KernelTree | None) -> Step:
    def run(ctx: Context) -> None:
        if preset is not None:
            ctx.facts["kernel_tree"] = preset
            return
        got = ctx.facts.get("headers_download")
        if got is not None:
            toolchain.install_archive(got.path, tools.headers, source_url=got.url,
                                      sha256=got.sha256, label=KERNEL_HEADERS)
        elif not tools.headers_ready():
            raise BuildError(f"kernel headers missing from {tools.headers}", path=str(tools.headers))
        tree = toolchain.find_kernel_tree(tools.headers, release)
        ctx.facts["kernel_tree"] = headers.KernelTree(tree, tree)
        log.info("kernel_headers_ready", path=str(tree), cached=got is None)

    where = preset.describe() if preset else f"{tools.headers} (safe extraction, reused when present)"
    return Step("prepare_kernel_headers", run, where)


def prepare_toolchain(tools: BuildTools, env: dict[str, str]) -> Step:
    def run(ctx: Context) -> None:
        from installer.sandbox import SANDBOX_PATH

        got = ctx.facts.get("toolchain_download")
        if got is not None:
            toolchain.install_archive(got.path, tools.toolchain, source_url=got.url,
                                      sha256=got.sha256, label="COS toolchain",
                                      exclude_patterns=toolchain.TOOLCHAIN_EXCLUDES)
        elif not tools.toolchain_ready(env["CC"]):
            raise BuildError(f"toolchain missing from {tools.toolchain}", path=str(tools.toolchain))
        toolchain.ensure_exec(tools.root, ctx.runner)
        linker = toolchain.link_ld(tools.toolchain, env)
        toolchain.check_compiler(tools.toolchain, env)
        ctx.facts["build_env"] = toolchain.compile_env(tools.toolchain, env, SANDBOX_PATH)
        # The sandbox is an overlay of the container's root: a separately mounted
        # tools dir (/build/cos-tools) must be bound into it.
        ctx.facts["build_binds"] = [(str(tools.root), str(tools.root))]
        toolchain.prune_other_builds(tools.tools_dir, tools.build_id)
        log.info("toolchain_ready", path=str(tools.toolchain), cc=env.get("CC"),
                 cxx=env.get("CXX"), ld=str(linker) if linker else None, cached=got is None)

    return Step("prepare_toolchain", run,
                f"{tools.toolchain}: CC={env.get('CC')} CXX={env.get('CXX')}, bin/ first on PATH, "
                "bin/ld -> cross linker (reused when present)")


def unpack_prebuilt(version: str) -> Step:
    """Extract nvidia-drivers-<V>.tgz safely into the staging area and check it."""

    def run(ctx: Context) -> None:
        staging: Tree = ctx.facts["staging"]
        got = ctx.facts["prebuilt_download"]
        dest = staging.root / "prebuilt"
        archive.extract(got.path, dest, label=prebuilt_modules_name(version), keep_xattrs=True)
        got.path.unlink(missing_ok=True)
        modules = _prebuilt_modules(dest)
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
        ctx.facts["prebuilt_dir"] = dest
        log.info("prebuilt_modules_unpacked", modules=sorted(modules), version=version)

    return Step("unpack_prebuilt", run, f"{prebuilt_modules_name(version)} -> <staging>/prebuilt "
                "(safe extraction, xattrs kept)")


def _prebuilt_modules(root: Path) -> dict[str, Path]:
    preferred = {p.name: p for p in sorted((root / "drivers").glob("*.ko")) if not p.is_symlink()}
    if preferred:
        return preferred
    return {p.name: p for p in sorted(root.rglob("*.ko")) if not p.is_symlink()}


def place_prebuilt() -> Step:
    """After the user-space install: the signed modules into drivers/, firmware merged in."""

    def run(ctx: Context) -> None:
        staging: Tree = ctx.facts["staging"]
        src: Path = ctx.facts["prebuilt_dir"]
        for name, path in _prebuilt_modules(src).items():
            os.chmod(path, 0o644)
            os.replace(path, staging.drivers / name)
        firmware = src / "firmware"
        if firmware.is_dir():
            for dirpath, _dirs, files in os.walk(firmware):
                rel = Path(dirpath).relative_to(firmware)
                (staging.firmware / rel).mkdir(parents=True, exist_ok=True)
                for f in files:
                    os.replace(Path(dirpath) / f, staging.firmware / rel / f)
        archive.remove_tree(src)

    return Step("place_prebuilt", run, "<staging>/prebuilt -> drivers/ and firmware/")


def unpack_signatures(version: str) -> Step:
    """Extract nvidia-drivers-<V>-signature.tar.gz safely (a tampered one is exit 6)."""

    def run(ctx: Context) -> None:
        staging: Tree = ctx.facts["staging"]
        got = ctx.facts["signatures_download"]
        dest = staging.root / "signatures"
        label = signatures_name(version).rsplit("/", 1)[-1]
        archive.extract(got.path, dest, label=label)
        got.path.unlink(missing_ok=True)
        missing = [m for m in PRECOMPILED_MODULES if not _signature_file(dest, m).is_file()]
        if missing:
            raise IntegrityError(
                f"{label} has no signature for {', '.join(missing)}",
                hint="the artifact is incomplete; check the COS artifacts URL", url=got.url)
        ctx.facts["signatures_dir"] = dest

    return Step("unpack_signatures", run,
                f"{signatures_name(version)} -> <staging>/signatures (safe extraction)")


def _signature_file(root: Path, module: str) -> Path:
    return root / f"{module}.sig"


def _linker(tools: BuildTools, env: dict[str, str]) -> Path:
    """The toolchain's lld (COS 85+ kernels are linked with it), as Google's installer."""
    bin_dir = tools.toolchain / "bin"
    prefix = toolchain._target_prefix(env.get("CC", ""))
    for name in ("ld.lld", f"{prefix}ld.lld"):
        if (bin_dir / name).is_file():
            return bin_dir / name
    found = toolchain.cross_linker(tools.toolchain, env)
    if found is None or not found.name.endswith("ld.lld"):
        raise BuildError(f"the COS toolchain has no ld.lld in {bin_dir}", path=str(bin_dir),
                         hint="remove the tools dir to fetch the toolchain again")
    return found


def link_precompiled(tools: BuildTools, env: dict[str, str], version: str) -> Step:
    """mkprecompiled --unpack, ld.lld -T module.lds for nvidia.ko and nvidia-modeset.ko,
    then each module + its PKCS#7 signature in the kernel's appended format, into
    <staging>/precompiled/drivers (placed into drivers/ after the user-space install)."""

    def run(ctx: Context) -> None:
        from installer.runner import CommandError

        staging: Tree = ctx.facts["staging"]
        extract: Path = ctx.facts["extract_dir"]
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
        source: Path = ctx.facts["kernel_tree"].output
        script = next((source / "scripts" / n for n in ("module.lds", "module-common.lds")
                       if (source / "scripts" / n).is_file()), None)
        if script is None:
            raise BuildError(f"the kernel headers have no scripts/module.lds ({source})",
                             path=str(source), kernel_release=ctx.host_info.kernel_release)
        lld = _linker(tools, env)
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
        sigs: Path = ctx.facts["signatures_dir"]
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
        archive.remove_tree(sigs)
        ctx.facts["prebuilt_dir"] = out.parent
        log.info("precompiled_modules_linked", modules=list(PRECOMPILED_MODULES),
                 linker=str(lld), linker_script=str(script), signed=True)

    return Step("link_precompiled", run,
                "mkprecompiled --unpack; ld.lld -T module.lds -r -o nvidia.ko / nvidia-modeset.ko; "
                "append Google's PKCS#7 signatures")


def preload_finished(tools: BuildTools) -> Step:
    def run(ctx: Context) -> None:
        log.info("preload_done", tools_dir=str(tools.root),
                 toolchain=str(tools.toolchain), kernel_headers=str(tools.headers))

    return Step("preload_finished", run, f"toolchain and headers cached in {tools.root}")


# --------------------------------------------------------------------------- the distro


class Cos(Distro):
    name = "cos"

    # -- inputs

    def _base(self, ctx: Context) -> str:
        info = ctx.host_info
        assert info.build_id is not None, "osinfo guarantees a COS BUILD_ID"
        return artifacts_base(ctx.settings.cos_artifacts_url, build_id=info.build_id,
                              board=info.board)

    def _artifacts(self, ctx: Context, policy: RetryPolicy | None = None) -> Artifacts:
        info = ctx.host_info
        assert info.build_id is not None, "osinfo guarantees a COS BUILD_ID"
        return Artifacts(self._base(ctx), info.build_id, info.board, ctx.http,
                         allow_insecure_http=ctx.settings.allow_insecure_http, policy=policy,
                         manifest=self._manifest(ctx))

    def _manifest(self, ctx: Context) -> pins.Manifest | None:
        """--cos-artifacts-sha256, loaded once per run."""
        location = ctx.settings.cos_artifacts_sha256
        if not location:
            return None
        if "cos_manifest" not in ctx.facts:
            from installer.download import fetch_text

            if "://" in location:
                check_url_scheme(location, allow_insecure_http=ctx.settings.allow_insecure_http)
            ctx.facts["cos_manifest"] = pins.load(location, lambda url: fetch_text(
                ctx.http, url, allow_insecure_http=ctx.settings.allow_insecure_http))
        return ctx.facts["cos_manifest"]

    def _mirror(self, ctx: Context) -> str | None:
        """Google's regional mirror of NVIDIA's files (gke/mirror.py says why), asked for
        only when no driver URL or base URL was given."""
        if ctx.settings.driver_url or ctx.settings.driver_base_url:
            return None
        from installer.gke import mirror

        return mirror.mirror_base_url(mirror.gce_zone())

    def _tools(self, ctx: Context) -> BuildTools:
        assert ctx.host_info.build_id is not None
        tools_dir = toolchain.default_tools_dir(ctx.settings.toolchain_dir, ctx.host,
                                                str(ctx.settings.toolchain_dir_host))
        return BuildTools(tools_dir, ctx.host_info.build_id)

    def _usable_cache(self, ctx: Context) -> cache.CacheRecord | None:
        """The .cache record of an intact install for this build, if any."""
        if ctx.settings.force:
            return None
        record = cache.read(ctx.install.cache_file)
        if (record is None or record.build_id != ctx.host_info.build_id
                or not record.driver_version
                or cache.check_files(record, ctx.install.root) is not None):
            return None
        return record

    def resolve(self, ctx: Context) -> Resolved:
        if ctx.settings.driver_url and not ctx.settings.driver_version:
            # The .run named explicitly says which version it is (as on Ubuntu).
            from installer.nvidia_run import version_from_url

            return Resolved(version_from_url(ctx.settings.driver_url), "(from --driver-url)")
        requested = parse_requested(ctx.settings.driver_version)
        if requested.version is not None:
            return Resolved(requested.version, requested.raw)
        record = self._usable_cache(ctx)
        arts = self._artifacts(ctx, quick_policy() if record else None)
        try:
            resolved = arts.resolve(requested)
        except MissingArtifactError:
            raise
        except DownloadError as exc:
            if record is None:
                raise
            # An alias of a given build names one version; the cached install of
            # this build is what it resolved to when the server was reachable.
            log.warning("driver_version_alias_unreachable", alias=requested.alias,
                        error=exc.message, using_cached=record.driver_version)
            return Resolved(record.driver_version, requested.raw, requested.alias,
                            "(cached install of this build; artifacts unreachable)")
        if requested.alias in (DEFAULT_ALIAS, LATEST_ALIAS):
            resolved = self._gpu_fallback(ctx, arts, resolved)
        return resolved

    def _gpu_fallback(self, ctx: Context, arts: Artifacts, resolved: Resolved) -> Resolved:
        """default/latest name a branch these GPUs cannot use: the newest branch alias
        of this build that they can (an explicit version or branch is never changed)."""
        from installer import gpus

        found = gpus.scan(ctx.kernel.sys_dir)
        for alias in fallback_alias(found, resolved.version):
            try:
                alt = arts.resolve(Requested(alias, alias=alias))
            except MissingArtifactError:
                continue
            if gpus.branch_problems(found, alt.version):
                continue
            why = (f"{resolved.alias} names {resolved.version}, which "
                   f"{', '.join(sorted({g.name for g in found if g.model}))} cannot use; "
                   f"using {alias} = {alt.version}")
            log.warning("driver_version_fallback", driver_version=alt.version, reason=why)
            return Resolved(alt.version, resolved.requested, alias, alt.source_url, why)
        return resolved

    def driver_version(self, ctx: Context) -> str:
        return self.resolve(ctx).version

    def cache_key(self, ctx: Context, version: str, flavor: str | None = None) -> CacheKey:
        return CacheKey(version, build_id=ctx.host_info.build_id, flavor=flavor)

    # -- plans

    def plan(self, ctx: Context) -> Plan:
        if ctx.settings.preload:
            return self._preload_plan(ctx)
        resolved = self.resolve(ctx)
        version = resolved.version
        summary: dict[str, object] = {
            "driver_version": version,
            **resolved.describe(),
            "build_id": ctx.host_info.build_id,
            "board": ctx.host_info.board,
            "milestone": ctx.host_info.version_id,
            "artifacts_url": self._base(ctx),
        }
        # Any intact install of this build and version is a hit, whatever its
        # flavour: no network needed to restart a node.
        if self.cache_hit(ctx, self.cache_key(ctx, version)):
            record = cache.read(ctx.install.cache_file)
            summary["flavor"] = record.flavor if record else None
            cached_type = _flavor_module_type(summary["flavor"])
            summary["kernel_module_type"] = cached_type
            return Plan("cached", (
                check_gpus(version, ctx.settings.kernel_module_type, cached_type),
                *steps.load_cached(ctx, version),
            ), summary)

        arts = self._artifacts(ctx)

        run_url = driver_url(ctx.settings, version, self._mirror(ctx))
        prebuilt_name = prebuilt_modules_name(version)
        prebuilt_url = arts.url(prebuilt_name)
        from installer import gpus

        gpus_found = gpus.scan(ctx.kernel.sys_dir)
        decision = decide_modules(gpus_found, version, ctx.settings.kernel_module_type,
                                  arts.exists(prebuilt_name))
        for note in decision.notes:
            log.warning("kernel_module_choice", note=note)
        prebuilt = decision.use_prebuilt
        policy = signing_policy(ctx.kernel)
        signatures_url = arts.url(signatures_name(version))
        custom_url = arts.url(custom_run_name(version))
        # The precompiled proprietary driver is used only where it is needed: when the
        # kernel loads only signed modules and the build's signed open modules cannot
        # serve these GPUs (pre-Turing). Where unsigned modules load, compiling stays the
        # default: it builds whichever module type the GPUs need (the custom .run is
        # proprietary only), from the build's own headers, and costs no probes of
        # Google-only artifacts on every fresh install.
        # As cos-gpu-installer v2 (install.go L313: no prebuilt modules -> the precompiled
        # .run), for any branch, unless these GPUs or the user need the open modules.
        precompiled = (
            not prebuilt and policy.enforced and not policy.loadpin_blocks
            and proprietary_allowed(gpus_found, ctx.settings.kernel_module_type)
            and arts.exists(signatures_name(version)) and arts.exists(custom_run_name(version))
        )
        signed_ok = prebuilt or precompiled
        flavor = (FLAVOR_PREBUILT if prebuilt else FLAVOR_PRECOMPILED if precompiled
                  else f"compiled-{decision.compiled_type}")
        key = self.cache_key(ctx, version, flavor)
        summary.update({
            "flavor": flavor,
            "kernel_module_type": ("open" if prebuilt else "proprietary" if precompiled
                                   else decision.compiled_type),
            "driver_url": run_url,
            "prebuilt_modules_url": prebuilt_url,
            "prebuilt_modules_used": prebuilt,
            "gpus": [g.describe() for g in gpus_found],
            "signatures_enforced": policy.enforced,
            "signature_enforcement": list(policy.reasons),
        })
        if decision.notes:
            summary["kernel_module_notes"] = list(decision.notes)
        if precompiled:
            summary.update({"precompiled_driver_url": custom_url,
                            "signatures_url": signatures_url})
        if policy.loadpin_blocks or (policy.enforced and not signed_ok):
            summary["blocked"] = "module signature policy: the install would stop with exit 10"
        note = ("signed prebuilt modules: allowed" if prebuilt else
                "precompiled modules with Google's signatures: allowed" if precompiled else
                "compiled modules are unsigned: refused if signatures are enforced")
        sign_step = check_signing(
            note, prebuilt=signed_ok, version=version, build_id=arts.build_id,
            prebuilt_url=prebuilt_url,
            # Notes about prebuilt modules exist only when the build has them.
            unusable=tuple(n for n in decision.notes if "prebuilt" in n),
            signatures_url=signatures_url if policy.enforced else None,
            signed_what="precompiled modules signed by Google" if precompiled
            else "signed prebuilt modules")
        tail = steps.activate_staged(ctx, version, key)
        run_sha = ctx.settings.driver_sha256 or (arts.manifest.lookup(run_url.rsplit("/", 1)[-1])
                                                 if arts.manifest else None)
        run_fetch = Fetch("driver_download", run_url, "staging", "driver", run_sha)
        summary["driver_sha256"] = run_sha
        if prebuilt:
            fetches = (run_fetch,
                       Fetch("prebuilt_download", prebuilt_url, "staging", "prebuilt modules",
                             arts.pin(prebuilt_url, "prebuilt modules")))
            return Plan("fresh", (
                check_gpus(version, ctx.settings.kernel_module_type, "open"),
                sign_step,
                steps.check_loaded_driver(version),
                steps.prepare_staging(),
                fetch_artifacts(fetches, None),
                unpack_prebuilt(version),
                steps.extract_driver(),
                steps.build_driver(version, userspace_only=True),
                place_prebuilt(),
                *tail,
            ), summary)

        tc_env, tc_url = self._toolchain_source(ctx, arts)
        from installer.gke import v2_tools

        tools = v2_tools.adopt(self._tools(ctx), ctx.host_info.kernel_release, tc_env["CC"],
                               pinned=arts.manifest is not None)
        headers_preset = self._host_headers(ctx)
        fetches = [run_fetch]
        if precompiled:
            # The custom .run replaces NVIDIA's public one (--driver-sha256 names that).
            fetches = [Fetch("driver_download", custom_url, "staging", "precompiled driver",
                             arts.pin(custom_url, "precompiled driver")),
                       Fetch("signatures_download", signatures_url, "staging", "signatures",
                             arts.pin(signatures_url, "signatures"))]
            summary["driver_url"] = custom_url
            summary["driver_sha256"] = fetches[0].sha256
        headers_url = arts.url(KERNEL_HEADERS)
        fetches += self._tools_fetches(arts, tools, tc_env, tc_url, headers_preset is None)
        summary.update({
            "kernel_headers_url": headers_url if headers_preset is None else None,
            "kernel_source_path": headers_preset.describe() if headers_preset else None,
            "toolchain_url": tc_url,
            "toolchain_env": {k: tc_env[k] for k in ("CC", "CXX") if k in tc_env},
            "tools_dir": str(tools.root),
        })
        if precompiled:
            return Plan("fresh", (
                check_gpus(version, ctx.settings.kernel_module_type, "proprietary"),
                sign_step,
                steps.check_loaded_driver(version),
                steps.prepare_staging(),
                fetch_artifacts(tuple(fetches), tools),
                unpack_signatures(version),
                prepare_kernel_headers(tools, ctx.host_info.kernel_release, headers_preset),
                prepare_toolchain(tools, tc_env),
                steps.extract_driver(),
                link_precompiled(tools, tc_env, version),
                steps.build_driver(version, userspace_only=True),
                place_prebuilt(),
                *tail,
            ), summary)
        return Plan("fresh", (
            check_gpus(version, ctx.settings.kernel_module_type, decision.compiled_type),
            sign_step,
            steps.check_loaded_driver(version),
            steps.prepare_staging(),
            fetch_artifacts(tuple(fetches), tools),
            prepare_kernel_headers(tools, ctx.host_info.kernel_release, headers_preset),
            prepare_toolchain(tools, tc_env),
            steps.extract_driver(),
            steps.build_driver(version, decision.compiled_type),
            *tail,
        ), summary)

    def _tools_fetches(self, arts: Artifacts, tools: BuildTools, tc_env: dict[str, str],
                       tc_url: str, want_headers: bool) -> list[Fetch]:
        """Kernel headers and toolchain, unless cached (from the pinned archives, if pinned)."""
        fetches = []
        headers_url = arts.url(KERNEL_HEADERS)
        pin = arts.pin(headers_url, "kernel headers") if want_headers else None
        if want_headers and not tools.headers_ready(pin):
            fetches.append(Fetch("headers_download", headers_url, "tools", "kernel headers", pin))
        pin = arts.pin(tc_url, "toolchain")
        if not tools.toolchain_ready(tc_env["CC"], pin):
            fetches.append(Fetch("toolchain_download", tc_url, "tools", "toolchain", pin))
        return fetches

    def _toolchain_source(self, ctx: Context, arts: Artifacts) -> tuple[dict[str, str], str]:
        env = parse_toolchain_env(arts.fetch_text(TOOLCHAIN_ENV_FILE))
        url = toolchain_location(arts.fetch_text(TOOLCHAIN_URL_FILE), arts.base,
                                 artifacts_root(ctx.settings.cos_artifacts_url))
        check_url_scheme(url, allow_insecure_http=ctx.settings.allow_insecure_http)
        return env, url

    def _host_headers(self, ctx: Context) -> headers.KernelTree | None:
        """--kernel-source-path, or headers already on the host; None: use kernel-headers.tgz."""
        release = ctx.host_info.kernel_release
        path, tried = headers.find_on_host(ctx.host, release, ctx.settings.kernel_source_path)
        if path is None and ctx.settings.kernel_source_path is not None:
            raise headers.not_found(release, tried)
        return path

    def _preload_plan(self, ctx: Context) -> Plan:
        arts = self._artifacts(ctx)
        tools = self._tools(ctx)
        tc_env, tc_url = self._toolchain_source(ctx, arts)
        headers_url = arts.url(KERNEL_HEADERS)
        fetches = self._tools_fetches(arts, tools, tc_env, tc_url, True)
        plan_steps: list[Step] = []
        if fetches:
            plan_steps.append(fetch_artifacts(tuple(fetches), tools))
        plan_steps += [
            prepare_kernel_headers(tools, ctx.host_info.kernel_release, None),
            prepare_toolchain(tools, tc_env),
            preload_finished(tools),
        ]
        return Plan("preload", tuple(plan_steps), {
            "driver_version": None,
            "build_id": ctx.host_info.build_id,
            "board": ctx.host_info.board,
            "artifacts_url": arts.base,
            "kernel_headers_url": headers_url,
            "toolchain_url": tc_url,
            "toolchain_env": {k: tc_env[k] for k in ("CC", "CXX") if k in tc_env},
            "tools_dir": str(tools.root),
            "already_cached": not fetches,
        })
