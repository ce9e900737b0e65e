"""COS installs: the inputs (the build's artifacts, the tools dir) and the plans."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import structlog

from installer import cache, gpus, headers, signing
from installer.cache import CacheKey, ModuleSource
from installer.distros.base import cached_plan, fresh_plan
from installer.distros.cos import pins, toolchain, v2_cache, v2_tools, versions
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
from installer.gke import mirror
from installer.net.fetch import fetch_text
from installer.net.policy import artifacts_root, check_url_scheme
from installer.plan import Plan, Step
from installer.steps import staging
from installer.steps.staging import Fetch

if TYPE_CHECKING:
    from installer.context import Context
    from installer.net.retry import RetryPolicy

log = structlog.get_logger(__name__)


class CosFlow(Cos):
    def __init__(self) -> None:
        self._pins: pins.Manifest | None = None

    # -- inputs

    def _base(self, ctx: Context) -> str:
        info = ctx.host_info
        assert info.build_id is not None, "osinfo guarantees a COS BUILD_ID"
        return artifacts_base(CosOptions.of(ctx.settings).artifacts_url, build_id=info.build_id,
                              board=info.board)

    def _artifacts(self, ctx: Context, policy: RetryPolicy | None = None) -> Artifacts:
        info = ctx.host_info
        assert info.build_id is not None, "osinfo guarantees a COS BUILD_ID"
        return Artifacts(self._base(ctx), info.build_id, info.board, ctx.http,
                         allow_insecure_http=ctx.settings.allow_insecure_http, policy=policy,
                         manifest=self._manifest(ctx))

    def _manifest(self, ctx: Context) -> pins.Manifest | None:
        """--cos-artifacts-sha256, loaded once per run (one CosFlow per run)."""
        location = CosOptions.of(ctx.settings).artifacts_sha256
        if not location:
            return None
        if self._pins is None:
            if "://" in location:
                check_url_scheme(location, allow_insecure_http=ctx.settings.allow_insecure_http)
            self._pins = pins.load(location, lambda url: fetch_text(
                ctx.http, url, allow_insecure_http=ctx.settings.allow_insecure_http))
        return self._pins

    def _tools(self, ctx: Context) -> BuildTools:
        assert ctx.host_info.build_id is not None
        options = CosOptions.of(ctx.settings)
        tools_dir = toolchain.default_tools_dir(options.toolchain_dir, ctx.host,
                                                str(options.toolchain_dir_host))
        return BuildTools(tools_dir, ctx.host_info.build_id)

    def _mirror(self, ctx: Context) -> str | None:
        """Google's regional mirror of NVIDIA's files (gke/mirror.py says why), asked for
        only when no driver URL or base URL was given."""
        if ctx.settings.driver_url or ctx.settings.driver_base_url:
            return None
        return mirror.mirror_base_url(mirror.gce_zone())

    def resolve(self, ctx: Context) -> Resolved:
        return versions.resolve(ctx, lambda policy: self._artifacts(ctx, policy))

    def driver_version(self, ctx: Context) -> str:
        return self.resolve(ctx).version

    def cache_key(self, ctx: Context, version: str, chosen: Choice | None = None) -> CacheKey:
        """Keyed by the build and version; a fresh install's key also names its modules
        (None: any intact install of them is a hit)."""
        key = self.node_key(ctx.host_info, version)
        if chosen is not None:
            key = dataclasses.replace(key, source=chosen.source, module_type=chosen.module_type)
        return v2_cache.with_v2_lines(key)

    # -- plans

    def plan(self, ctx: Context) -> Plan:
        """Probe (version, cache, the build's module sources, the node), decide (a pure
        ``choice.choose``), then list the steps for that choice."""
        if CosOptions.of(ctx.settings).preload:
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
            record = cache.read(ctx.install.cache_file)
            source = record.source if record else None
            cached_type = record.module_type if record else None
            return cached_plan(
                ctx, version, check_gpus(version, ctx.settings.kernel_module_type, cached_type),
                module_type=cached_type,
                display={**display, "module_source": source.value if source else None})
        arts = self._artifacts(ctx)
        probe = self._probe(ctx, arts, version)
        chosen = choose(probe, version)
        for note in chosen.notes:
            log.warning("kernel_module_choice", note=note)
        return self._fresh_plan(ctx, arts, version, probe, chosen, display)

    def _probe(self, ctx: Context, arts: Artifacts, version: str) -> Probe:
        """The node's GPUs and signature policy, and the build's module sources (the
        precompiled ones only when the choice could use them: two probes saved)."""
        found = tuple(gpus.scan(ctx.kernel.sys_dir))
        requested = ctx.settings.kernel_module_type
        policy = signing.policy(ctx.kernel)
        prebuilt_available = arts.exists(prebuilt_modules_name(version))
        use_prebuilt = decide_modules(list(found), version, requested,
                                      prebuilt_available).use_prebuilt
        precompiled_available = (
            precompiled_wanted(found, requested, policy, use_prebuilt)
            and arts.exists(signatures_name(version)) and arts.exists(custom_run_name(version)))
        return Probe(found, requested, policy, prebuilt_available, precompiled_available)

    def _fresh_plan(self, ctx: Context, arts: Artifacts, version: str, probe: Probe,
                    chosen: Choice, display: dict[str, object]) -> Plan:
        """The steps for ``chosen``: fetch, prepare, build (or user space only), load."""
        run_url = ctx.settings.driver_run_url(version, self._mirror(ctx))
        prebuilt_url = arts.url(prebuilt_modules_name(version))
        signatures_url = arts.url(signatures_name(version))
        custom_url = arts.url(custom_run_name(version))
        policy = probe.policy
        precompiled = chosen.source is ModuleSource.PRECOMPILED
        display.update({
            "module_source": chosen.source.value,
            "prebuilt_modules_url": prebuilt_url,
            "prebuilt_modules_used": chosen.source is ModuleSource.PREBUILT,
            "gpus": [g.describe() for g in probe.gpus],
            "signatures_enforced": policy.enforced,
            "signature_enforcement": list(policy.reasons),
        })
        if chosen.notes:
            display["kernel_module_notes"] = list(chosen.notes)
        if precompiled:
            display.update({"precompiled_driver_url": custom_url,
                            "signatures_url": signatures_url})
        if chosen.blocked:
            display["blocked"] = "module signature policy: the install would stop with exit 10"
        note = {ModuleSource.PREBUILT: "signed prebuilt modules: allowed",
                ModuleSource.PRECOMPILED: "precompiled modules with Google's signatures: allowed",
                ModuleSource.COMPILED: "compiled modules are unsigned: refused if signatures "
                "are enforced"}[chosen.source]
        sign_step = check_signing(
            note, prebuilt=chosen.signed, version=version, build_id=arts.build_id,
            prebuilt_url=prebuilt_url,
            # Notes about prebuilt modules exist only when the build has them.
            unusable=tuple(n for n in chosen.notes if "prebuilt" in n),
            signatures_url=signatures_url if policy.enforced else None,
            signed_what="precompiled modules signed by Google" if precompiled
            else "signed prebuilt modules")
        # With a manifest NVIDIA's .run is pinned like the build's files: listed, or exit 6.
        run_fetch = Fetch("driver", run_url, "driver",
                          ctx.settings.driver_sha256 or arts.pin(run_url, "driver"))
        if chosen.source is ModuleSource.PREBUILT:
            fetches = [run_fetch, Fetch("prebuilt", prebuilt_url, "prebuilt modules",
                                        arts.pin(prebuilt_url, "prebuilt modules"))]
            work = [unpack_prebuilt(version), staging.extract_driver(version)]
        else:
            if precompiled:  # the custom .run replaces NVIDIA's (--driver-sha256 names that)
                run_fetch = Fetch("driver", custom_url, "precompiled driver",
                                  arts.pin(custom_url, "precompiled driver"))
            fetches, work = self._build_work(ctx, arts, version, precompiled, display)
            fetches = [run_fetch, *fetches]
        # Signed modules come ready: the NVIDIA installer then installs user space only.
        work.append(staging.build_driver(ctx, version, chosen.compiled_type,
                                       userspace_only=chosen.signed))
        if chosen.signed:
            work.append(place_prebuilt())
        plan = fresh_plan(
            ctx, version, self.cache_key(ctx, version, chosen),
            module_type=chosen.module_type, driver_url=run_fetch.url,
            driver_sha256=run_fetch.sha256, display=display,
            check_gpus=check_gpus(version, ctx.settings.kernel_module_type,
                                  "open" if chosen.source is ModuleSource.PREBUILT
                                  else chosen.compiled_type),
            check_signing=sign_step, build=(staging.fetch_artifacts(tuple(fetches)), *work))
        if precompiled:  # v2's fallback: relink the legacy way when the load fails
            relinking = load_or_relink(version, ctx.settings.display_modules)
            plan = dataclasses.replace(plan, steps=tuple(
                relinking if s.name == relinking.name else s for s in plan.steps))
        return plan

    def _build_work(self, ctx: Context, arts: Artifacts, version: str, precompiled: bool,
                    display: dict[str, object]) -> tuple[list[Fetch], list[Step]]:
        """Compiled or precompiled modules: the signatures, the build's kernel headers and
        toolchain (cached, v2's, or fetched), and the steps that prepare them."""
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
        display.update({
            "kernel_headers_url": arts.url(KERNEL_HEADERS) if headers_preset is None else None,
            "kernel_source_path": headers_preset.describe() if headers_preset else None,
            "toolchain_url": tc_url,
            "toolchain_env": {k: tc_env[k] for k in ("CC", "CXX") if k in tc_env},
            "tools_dir": str(tools.root),
        })
        work: list[Step] = [
            *([unpack_signatures(version)] if precompiled else []),
            prepare_kernel_headers(tools, ctx.host_info.kernel_release, headers_preset),
            prepare_toolchain(tools, tc_env),
            staging.extract_driver(version),
            *([link_precompiled(tools, tc_env, version)] if precompiled else [])]
        return fetches, work

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
