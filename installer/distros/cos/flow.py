"""COS installs: the inputs (the build's artifacts, the tools dir) and the plans."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import structlog

from installer.base.kinds import OPEN
from installer.distros.base import Distro
from installer.distros.cos import boards, mirror, pins, toolchain, v2_cache, v2_tools, versions
from installer.distros.cos.artifacts import (
    KERNEL_HEADERS,
    TOOLCHAIN_ENV_FILE,
    TOOLCHAIN_URL_FILE,
    Artifacts,
    Resolved,
    artifacts_base,
    custom_run_name,
    parse_toolchain_env,
    prebuilt_modules_name,
    signatures_name,
    toolchain_location,
)
from installer.distros.cos.choice import (
    Choice,
    Probe,
    choose,
    decide_modules,
    precompiled_wanted,
)
from installer.distros.cos.host import Cos
from installer.distros.cos.options import CosOptions
from installer.distros.cos.precompiled import link_precompiled, load_or_relink, unpack_signatures
from installer.distros.cos.steps import (
    check_gpus,
    check_signing,
    place_prebuilt,
    preload_finished,
    prepare_kernel_headers,
    prepare_toolchain,
    unpack_prebuilt,
)
from installer.distros.cos.toolchain import BuildTools
from installer.distros.planning import DistroSteps, Flow, Wanted, cached_plan, fresh_plan
from installer.kmod import headers
from installer.net.fetch import fetch_text
from installer.net.policy import artifacts_root
from installer.plan import Plan, Step
from installer.records.cache import CacheKey, ModuleSource
from installer.steps import staging
from installer.steps.staging import Fetch

if TYPE_CHECKING:
    from installer.context import Context
    from installer.net.retry import RetryPolicy

log = structlog.get_logger(__name__)


class CosFlow(Flow):
    def __init__(self, distro: type[Distro] = Cos) -> None:
        super().__init__(distro)
        self._pins: pins.Manifest | None = None

    # -- inputs

    def _base(self, ctx: Context) -> str:
        info = ctx.host_info
        assert info.build_id is not None, "osinfo guarantees a COS BUILD_ID"
        template = boards.artifacts_template(CosOptions.of(ctx.settings).artifacts_url, ctx.arch)
        return artifacts_base(template, build_id=info.build_id, board=info.board)

    def _artifacts(self, ctx: Context, policy: RetryPolicy | None = None) -> Artifacts:
        info = ctx.host_info
        assert info.build_id is not None, "osinfo guarantees a COS BUILD_ID"
        return Artifacts(self._base(ctx), info.build_id, info.board, ctx.http, policy=policy,
                         manifest=self._manifest(ctx))

    def _manifest(self, ctx: Context) -> pins.Manifest | None:
        """--cos-artifacts-sha256, loaded once per run (one CosFlow per run)."""
        location = CosOptions.of(ctx.settings).artifacts_sha256
        if not location:
            return None
        if self._pins is None:
            if "://" in location:
                ctx.url_policy.check(location)
            self._pins = pins.load(location, lambda url: fetch_text(ctx.http, url))
        return self._pins

    def _tools(self, ctx: Context) -> BuildTools:
        assert ctx.host_info.build_id is not None
        options = CosOptions.of(ctx.settings)
        tools_dir = toolchain.default_tools_dir(options.toolchain_dir, ctx.host,
                                                str(options.toolchain_dir_host))
        return BuildTools(tools_dir, ctx.host_info.build_id)

    def _mirror(self, ctx: Context) -> str | None:
        """Google's regional mirror of NVIDIA's files (gke/mirror.py says why), asked for
        only when no driver URL or base URL was given, and only for the x86_64 files it
        names (boards.py): an aarch64 .run comes from NVIDIA's version directory."""
        if (ctx.settings.driver_url or ctx.settings.driver_base_url
                or not boards.uses_google_mirror(ctx.arch)):
            return None
        return mirror.mirror_base_url(mirror.gce_zone())

    def resolve(self, ctx: Context) -> Resolved:
        return versions.resolve(ctx, lambda policy: self._artifacts(ctx, policy))

    def driver_version(self, ctx: Context) -> str:
        return self.resolve(ctx).version

    def cache_key(self, ctx: Context, version: str, chosen: Choice | None = None) -> CacheKey:
        """Keyed by the build and version; a fresh install's key also names its modules
        (None: any intact install of them is a hit)."""
        key = self.distro.node_key(ctx.host_info, version)
        if chosen is not None:
            key = dataclasses.replace(key, source=chosen.source, module_type=chosen.module_type)
        return v2_cache.with_v2_lines(key)

    # -- plans

    def plan(self, ctx: Context) -> Plan:
        """Probe (version, cache, the build's module sources, the node), decide (a pure
        ``choice.choose``), then list the steps for that choice."""
        boards.check_board(ctx.arch, ctx.host_info.board)
        if CosOptions.of(ctx.settings).preload:
            if not boards.offers_compile(ctx.arch):
                raise boards.refuse_preload(ctx.arch)
            return self._preload_plan(ctx)
        resolved = self.resolve(ctx)
        version = resolved.version
        display: dict[str, object] = {
            **resolved.describe(),
            "build_id": ctx.host_info.build_id,
            "board": ctx.host_info.board,
            "milestone": ctx.host_info.version_id,
            "artifacts_url": self._base(ctx),
        }
        # Any intact install of this build and version is a hit, whatever its
        # module source: no network needed to restart a node.
        if self.cache_hit(ctx, self.cache_key(ctx, version)):
            record = ctx.node.installed
            source = record.source if record else None
            cached_type = record.module_type if record else None
            return cached_plan(
                ctx, version, check_gpus(version, ctx.settings.kernel_module_type, cached_type),
                module_type=cached_type,
                display={**display, "module_source": source.value if source else None})
        arts = self._artifacts(ctx)
        probe = self._probe(ctx, arts, version)
        chosen = choose(probe, version)
        if chosen.source is ModuleSource.COMPILED and not boards.offers_compile(ctx.arch):
            raise boards.refuse_compile(ctx.arch, arts.build_id, version,
                                        arts.url(prebuilt_modules_name(version)),
                                        _no_prebuilt(arts, version, probe, chosen))
        for note in chosen.notes:
            log.warning("kernel_module_choice", note=note)
        return self._fresh_plan(ctx, arts, version, probe, chosen, display)

    def _probe(self, ctx: Context, arts: Artifacts, version: str) -> Probe:
        """The node's GPUs and signature policy, and the build's module sources (the
        precompiled ones only when the choice could use them: two probes saved)."""
        found = ctx.pci_gpus
        requested = ctx.settings.kernel_module_type
        policy = ctx.node.signing
        prebuilt_available = arts.exists(prebuilt_modules_name(version))
        use_prebuilt = decide_modules(list(found), version, requested,
                                      prebuilt_available).use_prebuilt
        precompiled_available = (
            boards.offers_precompiled(ctx.arch)
            and precompiled_wanted(found, requested, policy, use_prebuilt)
            and arts.exists(signatures_name(version)) and arts.exists(custom_run_name(version)))
        return Probe(found, requested, policy, prebuilt_available, precompiled_available)

    def _fresh_plan(self, ctx: Context, arts: Artifacts, version: str, probe: Probe,
                    chosen: Choice, display: dict[str, object]) -> Plan:
        """The steps for ``chosen``: fetch, prepare, build (or user space only), load."""
        run_fetch, fetches, work, build_shown = self._fill(ctx, arts, version, chosen)
        precompiled = chosen.source is ModuleSource.PRECOMPILED
        wanted = Wanted(version, self.cache_key(ctx, version, chosen), chosen.module_type,
                        run_fetch.url, run_fetch.sha256)
        return fresh_plan(ctx, wanted, DistroSteps(
            check_gpus=check_gpus(version, ctx.settings.kernel_module_type,
                                  OPEN if chosen.source is ModuleSource.PREBUILT
                                  else chosen.compiled_type),
            check_signing=_signing_step(arts, version, probe, chosen),
            build=(staging.fetch_artifacts((run_fetch, *fetches)), *work),
            # v2's fallback for Google's precompiled modules: relink the legacy way when the
            # kernel refuses the first link.
            load=load_or_relink(version, ctx.settings.display_modules) if precompiled else None),
            {**display, **_choice_display(arts, version, probe, chosen), **build_shown})

    def _fill(self, ctx: Context, arts: Artifacts, version: str, chosen: Choice,
              ) -> tuple[Fetch, list[Fetch], list[Step], dict[str, object]]:
        """What fills the staging dir for ``chosen``: the .run's fetch, the other fetches, the
        steps, and what the plan shows about them."""
        run_url = ctx.settings.driver_run_url(version, self._mirror(ctx), ctx.arch.nvidia)
        # With a manifest NVIDIA's .run is pinned like the build's files: listed, or exit 6.
        run_fetch = Fetch("driver", run_url, "driver",
                          ctx.settings.driver_sha256 or arts.pin(run_url, "driver"))
        shown: dict[str, object] = {}
        if chosen.source is ModuleSource.PREBUILT:
            prebuilt_url = arts.url(prebuilt_modules_name(version))
            fetches = [Fetch("prebuilt", prebuilt_url, "prebuilt modules",
                             arts.pin(prebuilt_url, "prebuilt modules"))]
            work = [unpack_prebuilt(version), staging.extract_driver(version)]
        else:
            precompiled = chosen.source is ModuleSource.PRECOMPILED
            if precompiled:  # the custom .run replaces NVIDIA's (--driver-sha256 names that)
                custom_url = arts.url(custom_run_name(version))
                run_fetch = Fetch("driver", custom_url, "precompiled driver",
                                  arts.pin(custom_url, "precompiled driver"))
            fetches, work, shown = self._build_work(ctx, arts, version, precompiled)
        # Signed modules come ready: the NVIDIA installer then installs user space only.
        work.append(staging.build_driver(ctx, version, chosen.compiled_type,
                                         userspace_only=chosen.signed))
        if chosen.signed:
            work.append(place_prebuilt())
        return run_fetch, fetches, work, shown

    def _build_work(self, ctx: Context, arts: Artifacts, version: str, precompiled: bool,
                    ) -> tuple[list[Fetch], list[Step], dict[str, object]]:
        """Compiled or precompiled modules: the signatures, the build's kernel headers and
        toolchain (cached, v2's, or fetched), the steps that prepare them, and what the plan
        shows about them."""
        fetches = []
        if precompiled:
            signatures_url = arts.url(signatures_name(version))
            fetches.append(Fetch("signatures", signatures_url, "signatures",
                                 arts.pin(signatures_url, "signatures")))
        tc_env, tc_url = self._toolchain_source(ctx, arts)
        tools = v2_tools.adopt(self._tools(ctx), ctx.host_info.kernel_release, tc_env["CC"],
                               pinned=arts.manifest is not None)
        toolchain.check_tool_paths(tc_env, tools.toolchain, arts.url(TOOLCHAIN_ENV_FILE))
        headers_preset = self._host_headers(ctx)
        fetches += self._tools_fetches(arts, tools, tc_env, tc_url, headers_preset is None)
        shown: dict[str, object] = {
            "kernel_headers_url": arts.url(KERNEL_HEADERS) if headers_preset is None else None,
            "kernel_source_path": headers_preset.describe() if headers_preset else None,
            "toolchain_url": tc_url,
            "toolchain_env": {k: tc_env[k] for k in ("CC", "CXX") if k in tc_env},
            "tools_dir": str(tools.root),
        }
        work: list[Step] = [
            *([unpack_signatures(version)] if precompiled else []),
            prepare_kernel_headers(tools, ctx.host_info.kernel_release, headers_preset),
            prepare_toolchain(tools, tc_env),
            staging.extract_driver(version),
            *([link_precompiled(tools, tc_env, version)] if precompiled else [])]
        return fetches, work, shown

    def _tools_fetches(self, arts: Artifacts, tools: BuildTools, tc_env: dict[str, str],
                       tc_url: str, want_headers: bool) -> list[Fetch]:
        """Kernel headers and toolchain, unless cached (from the pinned archives, if pinned)."""
        fetches = []
        headers_url = arts.url(KERNEL_HEADERS)
        pin = arts.pin(headers_url, "kernel headers") if want_headers else None
        if want_headers and not tools.headers_ready(pin):
            fetches.append(Fetch("headers", headers_url, "kernel headers", pin,
                                 tools.downloads))
        pin = arts.pin(tc_url, "toolchain")
        if not tools.toolchain_ready(tc_env["CC"], pin):
            fetches.append(Fetch("toolchain", tc_url, "toolchain", pin, tools.downloads))
        return fetches

    def _toolchain_source(self, ctx: Context, arts: Artifacts) -> tuple[dict[str, str], str]:
        env = parse_toolchain_env(arts.fetch_text(TOOLCHAIN_ENV_FILE),
                                  arts.url(TOOLCHAIN_ENV_FILE))
        url = toolchain_location(arts.fetch_text(TOOLCHAIN_URL_FILE), arts.base,
                                 artifacts_root(CosOptions.of(ctx.settings).artifacts_url))
        ctx.url_policy.check(url)
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
        toolchain.check_tool_paths(tc_env, tools.toolchain, arts.url(TOOLCHAIN_ENV_FILE))
        headers_url = arts.url(KERNEL_HEADERS)
        fetches = self._tools_fetches(arts, tools, tc_env, tc_url, True)
        plan_steps: list[Step] = []
        if fetches:
            plan_steps.append(staging.fetch_artifacts(tuple(fetches)))
        plan_steps += [
            prepare_kernel_headers(tools, ctx.host_info.kernel_release, None),
            prepare_toolchain(tools, tc_env),
            preload_finished(tools),
        ]
        return Plan("preload", tuple(plan_steps), display={
            "build_id": ctx.host_info.build_id,
            "board": ctx.host_info.board,
            "artifacts_url": arts.base,
            "kernel_headers_url": headers_url,
            "toolchain_url": tc_url,
            "toolchain_env": {k: tc_env[k] for k in ("CC", "CXX") if k in tc_env},
            "tools_dir": str(tools.root),
            "already_cached": not fetches,
        })


def _choice_display(arts: Artifacts, version: str, probe: Probe,
                    chosen: Choice) -> dict[str, object]:
    """What the plan shows about the module choice and what it was made from."""
    shown: dict[str, object] = {
        "module_source": chosen.source.value,
        "prebuilt_modules_url": arts.url(prebuilt_modules_name(version)),
        "prebuilt_modules_used": chosen.source is ModuleSource.PREBUILT,
        "gpus": [g.describe() for g in probe.gpus],
        "signatures_enforced": probe.policy.enforced,
        "signature_enforcement": list(probe.policy.reasons),
    }
    if chosen.notes:
        shown["kernel_module_notes"] = list(chosen.notes)
    if chosen.source is ModuleSource.PRECOMPILED:
        shown.update({"precompiled_driver_url": arts.url(custom_run_name(version)),
                      "signatures_url": arts.url(signatures_name(version))})
    if chosen.blocked:
        shown["blocked"] = "module signature policy: the install would stop with exit 10"
    return shown


# What the signing check says about each module source.
SIGNING_NOTES = {
    ModuleSource.PREBUILT: "signed prebuilt modules: allowed",
    ModuleSource.PRECOMPILED: "precompiled modules with Google's signatures: allowed",
    ModuleSource.COMPILED: "compiled modules are unsigned: refused if signatures are enforced",
}


def _signing_step(arts: Artifacts, version: str, probe: Probe, chosen: Choice) -> Step:
    precompiled = chosen.source is ModuleSource.PRECOMPILED
    return check_signing(
        SIGNING_NOTES[chosen.source], prebuilt=chosen.signed, version=version,
        build_id=arts.build_id, prebuilt_url=arts.url(prebuilt_modules_name(version)),
        # Notes about prebuilt modules exist only when the build has them.
        unusable=tuple(n for n in chosen.notes if "prebuilt" in n),
        signatures_url=arts.url(signatures_name(version)) if probe.policy.enforced else None,
        signed_what="precompiled modules signed by Google" if precompiled
        else "signed prebuilt modules")


def _no_prebuilt(arts: Artifacts, version: str, probe: Probe, chosen: Choice) -> str:
    """Why the build's prebuilt modules are not what this install uses."""
    if not probe.prebuilt_available:
        return (f"it publishes no prebuilt modules for driver {version} "
                f"({arts.url(prebuilt_modules_name(version))} not found)")
    return "; ".join(chosen.notes) or "its prebuilt modules cannot be used here"
