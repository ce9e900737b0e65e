"""How distros whose driver is compiled against the host kernel's headers (Ubuntu,
Debian) install: find the headers, build in the sandbox, or take a fleet's bundle."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import structlog

from installer.base.cpuarch import CpuArch
from installer.base.kinds import ModuleType
from installer.distros.base import Distro
from installer.distros.headers_build import HeadersBuild
from installer.distros.planning import DistroSteps, Flow, Wanted, cached_plan, fresh_plan
from installer.driver.nvidia_options import check_version
from installer.driver.nvidia_urls import version_from_url
from installer.host import gpus
from installer.kmod import headers
from installer.plan import Plan, Step
from installer.records.cache import CacheKey, ModuleSource
from installer.records.results import HeadersReady
from installer.steps import checks, staging

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)


def find_kernel_headers() -> Step:
    """The host's headers (``--kernel-source-path``, /usr/src, /lib/modules/<r>/build), else
    ``apt-get install linux-headers-<r>`` in this container when it has apt."""

    def run(ctx: Context) -> HeadersReady:
        release = ctx.host_info.kernel_release
        tree, tried = headers.find_on_host(ctx.host, release, ctx.settings.kernel_source_path)
        import shutil  # a build's step: a cache hit finds no headers (shutil costs it ~5 ms)

        if tree is None and ctx.settings.kernel_source_path is None and shutil.which("apt-get"):
            tree = headers.apt_install(ctx.runner, ctx.host, release, tried)
        if tree is None:
            raise headers.not_found(release, tried)
        log.info("kernel_headers_found", source=str(tree.source), output=str(tree.output))
        return HeadersReady(tree)

    return Step("find_kernel_headers", run,
                "--kernel-source-path, host /usr/src/linux-headers-<r>, /lib/modules/<r>/build, apt-get",
                gives=(HeadersReady,))


def compile_steps(ctx: Context, url: str, version: str, module_type: str,
                  cross: CpuArch | None = None) -> tuple[Step, ...]:
    """The NVIDIA .run downloaded, extracted and built in the sandbox: install's build and
    ``bundle build``'s are this one sequence (``cross``: bundle build --arch's target)."""
    return (staging.download_driver(url, ctx.settings.driver_sha256),
            staging.extract_driver(version),
            staging.build_driver(ctx, version, module_type, cross=cross))


class HeadersBuildFlow(Flow):
    """Driver version, cache key and plan in one place, the headers step as the one
    variation (a subclass may override ``headers_step``), for a ``HeadersBuild`` distro."""

    def __init__(self, distro: type[Distro]) -> None:
        assert issubclass(distro, HeadersBuild), f"{distro.name} is not a HeadersBuild distro"
        super().__init__(distro)

    def headers_step(self) -> Step:
        """Where this distro's kernel headers come from (the step returns HeadersReady)."""
        return find_kernel_headers()

    def driver_version(self, ctx: Context) -> str:
        explicit = ctx.settings.driver_version
        if explicit and explicit != "default":
            return check_version(explicit)
        if ctx.settings.driver_url:
            return version_from_url(ctx.settings.driver_url)
        # The default, or the newest tested branch the GPUs here support (K80: R470).
        version, why = gpus.pick_default(list(ctx.pci_gpus), self.distro.default_version)
        if why:
            log.info("driver_version_fallback", driver_version=version, reason=why)
        return version

    def module_type(self, ctx: Context, version: str) -> ModuleType:
        found = list(ctx.pci_gpus)
        return gpus.choose_module_type(found, version, ctx.settings.kernel_module_type).module_type

    def cache_key(self, ctx: Context, version: str) -> CacheKey:
        return replace(self.distro.node_key(ctx.host_info, version), source=ModuleSource.COMPILED,
                       module_type=self.module_type(ctx, version))

    def plan(self, ctx: Context) -> Plan:
        version = self.driver_version(ctx)
        key = self.cache_key(ctx, version)
        module_type = key.module_type
        assert module_type is not None, "cache_key names the module type"
        display: dict[str, object] = {"kernel_release": ctx.host_info.kernel_release}
        check_gpus = checks.check_gpus(version, ctx.settings.kernel_module_type)
        if self.cache_hit(ctx, key):
            return cached_plan(ctx, version, check_gpus, module_type=module_type,
                               display=display)
        url = ctx.settings.driver_run_url(version, arch=ctx.arch.nvidia)
        prebuilt = None
        if ctx.settings.prebuilt_url:  # a fleet's precompiled bundle first, else the build
            # The bundle's index and fetch: only a run given a bundle URL loads them.
            from installer.bundle.fetch import prebuilt_step

            prebuilt = prebuilt_step(ctx, version, module_type)
        return fresh_plan(
            ctx, Wanted(version, key, module_type, url, ctx.settings.driver_sha256),
            DistroSteps(
                check_gpus=check_gpus,
                check_signing=checks.check_module_signing("this flow builds unsigned modules"),
                before_staging=(self.headers_step(),),
                build=compile_steps(ctx, url, version, module_type),
                prebuilt=prebuilt),
            display)
