"""Ubuntu (and Debian): build the NVIDIA driver against the host kernel's headers."""

from __future__ import annotations

import shutil

from installer import headers, steps
from installer.cache import CacheKey
from installer.context import Context
from installer.distros.base import Distro
from installer.nvidia_run import check_version, version_from_url
from installer.plan import Plan, Step

# A version tested with this installer; NVIDIA_DRIVER_VERSION picks another.
DEFAULT_DRIVER_VERSION = "550.127.05"
FLAVOR = "compiled-proprietary"


def driver_url(ctx: Context, version: str) -> str:
    s = ctx.settings
    if s.driver_url:
        return s.driver_url
    from installer.nvidia_run import run_file_name

    return f"{s.driver_base_url.rstrip('/')}/{version}/{run_file_name(version)}"


def find_kernel_headers() -> Step:
    def run(ctx: Context) -> None:
        release = ctx.host_info.kernel_release
        path, tried = headers.find_on_host(ctx.host, release, ctx.settings.kernel_source_path)
        if path is None and ctx.settings.kernel_source_path is None and shutil.which("apt-get"):
            path = headers.apt_install(ctx.runner, release, tried)
        if path is None:
            raise headers.not_found(release, tried)
        ctx.facts["kernel_source"] = path

    return Step("find_kernel_headers", run,
                "--kernel-source-path, host /usr/src/linux-headers-<r>, /lib/modules/<r>/build, apt-get")


class Ubuntu(Distro):
    name = "ubuntu"

    def driver_version(self, ctx: Context) -> str:
        explicit = ctx.settings.driver_version
        if explicit:
            return check_version(explicit)
        if ctx.settings.driver_url:
            return version_from_url(ctx.settings.driver_url)
        return DEFAULT_DRIVER_VERSION

    def cache_key(self, ctx: Context, version: str) -> CacheKey:
        return CacheKey(version, kernel_release=ctx.host_info.kernel_release, flavor=FLAVOR)

    def plan(self, ctx: Context) -> Plan:
        version = self.driver_version(ctx)
        key = self.cache_key(ctx, version)
        summary = {"driver_version": version, "kernel_release": ctx.host_info.kernel_release}
        if self.cache_hit(ctx, key):
            return Plan("cached", (
                steps.clear_leftovers(),
                steps.check_loaded_driver(version),
                steps.unload_other_driver(version),
                steps.load_modules(from_staging=False),
                steps.device_nodes(from_staging=False),
                steps.container_ld_cache(),
                steps.host_ld_cache(),
                steps.verify_install(version),
            ), summary)
        url = driver_url(ctx, version)
        return Plan("fresh", (
            steps.check_module_signing("this flow builds unsigned modules"),
            steps.check_loaded_driver(version),
            find_kernel_headers(),
            steps.prepare_staging(),
            steps.download_driver(url, ctx.settings.driver_sha256),
            steps.extract_driver(),
            steps.build_driver(),
            steps.unload_other_driver(version),
            steps.load_modules(from_staging=True),
            steps.device_nodes(from_staging=True),
            steps.verify_staged(version),
            steps.promote(),
            steps.container_ld_cache(),
            steps.host_ld_cache(),
            steps.verify_install(version),
            steps.record_cache(key),
        ), {**summary, "driver_url": url})
