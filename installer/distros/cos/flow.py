"""COS installs: the inputs (the build's artifacts, the tools dir) and the plans."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import structlog

from installer import headers, signing, steps
from installer.cache import CacheKey
from installer.distros.base import cached_plan, fresh_plan
from installer.distros.cos import Cos, pins, toolchain, v2_cache, v2_tools, versions
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
    FLAVOR_PREBUILT,
    FLAVOR_PRECOMPILED,
    decide_modules,
    flavor_module_type,
    proprietary_allowed,
)
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
from installer.net.policy import artifacts_root, check_url_scheme
from installer.nvidia_run import driver_url
from installer.plan import Plan, Step
from installer.steps import Fetch

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
        return artifacts_base(ctx.settings.cos_artifacts_url, build_id=info.build_id,
                              board=info.board)

    def _artifacts(self, ctx: Context, policy: RetryPolicy | None = None) -> Artifacts:
        info = ctx.host_info
        assert info.build_id is not None, "osinfo guarantees a COS BUILD_ID"
        return Artifacts(self._base(ctx), info.build_id, info.board, ctx.http,
                         allow_insecure_http=ctx.settings.allow_insecure_http, policy=policy,
                         manifest=self._manifest(ctx))

    def _manifest(self, ctx: Context) -> pins.Manifest | None:
        """--cos-artifacts-sha256, loaded once per run (one CosFlow per run)."""
        location = ctx.settings.cos_artifacts_sha256
        if not location:
            return None
        if self._pins is None:
            from installer.net.fetch import fetch_text

            if "://" in location:
                check_url_scheme(location, allow_insecure_http=ctx.settings.allow_insecure_http)
            self._pins = pins.load(location, lambda url: fetch_text(
                ctx.http, url, allow_insecure_http=ctx.settings.allow_insecure_http))
        return self._pins

    def _tools(self, ctx: Context) -> BuildTools:
        assert ctx.host_info.build_id is not None
        tools_dir = toolchain.default_tools_dir(ctx.settings.toolchain_dir, ctx.host,
                                                str(ctx.settings.toolchain_dir_host))
        return BuildTools(tools_dir, ctx.host_info.build_id)

    def _mirror(self, ctx: Context) -> str | None:
        """Google's regional mirror of NVIDIA's files (gke/mirror.py says why), asked for
        only when no driver URL or base URL was given."""
        if ctx.settings.driver_url or ctx.settings.driver_base_url:
            return None
        from installer.gke import mirror

        return mirror.mirror_base_url(mirror.gce_zone())

    def resolve(self, ctx: Context) -> Resolved:
        return versions.resolve(ctx, lambda policy: self._artifacts(ctx, policy))

    def driver_version(self, ctx: Context) -> str:
        return self.resolve(ctx).version

    def cache_key(self, ctx: Context, version: str, flavor: str | None = None) -> CacheKey:
        key = dataclasses.replace(self.node_key(ctx.host_info, version), flavor=flavor)
        return v2_cache.with_v2_lines(key)

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
            record = self.read_cache(ctx.install.cache_file)
            summary["flavor"] = record.flavor if record else None
            cached_type = flavor_module_type(summary["flavor"])
            summary["kernel_module_type"] = cached_type
            return cached_plan(
                ctx, version, check_gpus(version, ctx.settings.kernel_module_type, cached_type),
                summary)

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
        policy = signing.policy(ctx.kernel)
        signatures_url = arts.url(signatures_name(version))
        custom_url = arts.url(custom_run_name(version))
        # The precompiled proprietary driver is used only where it is needed: when the
        # kernel loads only signed modules and the build's signed open modules are missing
        # or cannot serve these GPUs (pre-Turing). Where unsigned modules load, compiling stays the
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
        # With a manifest NVIDIA's .run is pinned like the build's files: listed, or exit 6.
        run_sha = ctx.settings.driver_sha256 or arts.pin(run_url, "driver")
        summary["driver_sha256"] = run_sha
        fetches = [Fetch("driver", run_url, "driver", run_sha)]
        if prebuilt:
            fetches.append(Fetch("prebuilt", prebuilt_url, "prebuilt modules",
                                 arts.pin(prebuilt_url, "prebuilt modules")))
            work = [unpack_prebuilt(version), steps.extract_driver()]
        else:
            tc_env, tc_url = self._toolchain_source(ctx, arts)
            tools = v2_tools.adopt(self._tools(ctx), ctx.host_info.kernel_release, tc_env["CC"],
                                   pinned=arts.manifest is not None)
            toolchain.check_tool_paths(tc_env, tools.toolchain, arts.url(TOOLCHAIN_ENV_FILE))
            headers_preset = self._host_headers(ctx)
            if precompiled:
                # The custom .run replaces NVIDIA's public one (--driver-sha256 names that).
                fetches = [Fetch("driver", custom_url, "precompiled driver",
                                 arts.pin(custom_url, "precompiled driver")),
                           Fetch("signatures", signatures_url, "signatures",
                                 arts.pin(signatures_url, "signatures"))]
                summary["driver_url"] = custom_url
                summary["driver_sha256"] = fetches[0].sha256
            fetches += self._tools_fetches(arts, tools, tc_env, tc_url, headers_preset is None)
            summary.update({
                "kernel_headers_url": arts.url(KERNEL_HEADERS) if headers_preset is None else None,
                "kernel_source_path": headers_preset.describe() if headers_preset else None,
                "toolchain_url": tc_url,
                "toolchain_env": {k: tc_env[k] for k in ("CC", "CXX") if k in tc_env},
                "tools_dir": str(tools.root),
            })
            work = [*([unpack_signatures(version)] if precompiled else []),
                    prepare_kernel_headers(tools, ctx.host_info.kernel_release, headers_preset),
                    prepare_toolchain(tools, tc_env),
                    steps.extract_driver(),
                    *([link_precompiled(tools, tc_env, version)] if precompiled else [])]
        # Signed modules come ready: the NVIDIA installer then installs user space only.
        work.append(steps.build_driver(ctx, version, decision.compiled_type,
                                       userspace_only=signed_ok))
        if signed_ok:
            work.append(place_prebuilt())
        plan = fresh_plan(
            ctx, version, key, summary,
            check_gpus=check_gpus(version, ctx.settings.kernel_module_type,
                                  "open" if prebuilt else decision.compiled_type),
            check_signing=sign_step, build=(steps.fetch_artifacts(tuple(fetches)), *work))
        if precompiled:  # v2's fallback: relink the legacy way when the load fails
            relinking = load_or_relink(version)
            plan = dataclasses.replace(plan, steps=tuple(
                relinking if s.name == relinking.name else s for s in plan.steps))
        return plan

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
        toolchain.check_tool_paths(tc_env, tools.toolchain, arts.url(TOOLCHAIN_ENV_FILE))
        headers_url = arts.url(KERNEL_HEADERS)
        fetches = self._tools_fetches(arts, tools, tc_env, tc_url, True)
        plan_steps: list[Step] = []
        if fetches:
            plan_steps.append(steps.fetch_artifacts(tuple(fetches)))
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
