"""``nvidia-driver-installer bundle build|index``."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import click
import structlog

from installer.base import cpuarch
from installer.base.branches import EXAMPLE_VERSION
from installer.base.errors import UsageError
from installer.base.kinds import MODULE_TYPE_REQUESTS
from installer.base.podcontract import HOST_ROOT
from installer.driver.nvidia_urls import DEFAULT_DRIVER_BASE_URL

log = structlog.get_logger(__name__)

LOG_FORMATS = click.Choice(["auto", "json", "console"])
# uname -m's and dpkg's spellings: x86_64 amd64 aarch64 arm64.
ARCH_NAMES = [name for a in cpuarch.ARCHES for name in (a.machine, a.debian)]


@click.group("bundle", short_help="Build precompiled driver bundles once per kernel; index them.")
def bundle() -> None:
    """Build precompiled driver bundles once per kernel, and index them."""


def pick_target(targets: str, index: int | None) -> tuple[str, str]:
    """``V@R V@R ...`` and a Job completion index -> (driver version, kernel release)."""
    items = targets.replace(",", " ").split()
    if index is None or not 0 <= index < len(items):
        raise UsageError(f"--target-index {index} is not an index into the {len(items)} "
                         "--targets", hint="an Indexed Job sets JOB_COMPLETION_INDEX")
    version, at, release = items[index].partition("@")
    if not (at and version and release):
        raise UsageError(f"bad --targets item {items[index]!r}",
                         hint="use DRIVER_VERSION@KERNEL_RELEASE, e.g. "
                              f"{EXAMPLE_VERSION}@6.8.0-1015-gke")
    return version, release


@bundle.command("build")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              envvar="NVIDIA_BUNDLE_OUTPUT_DIR", show_envvar=True,
              help="Where the bundle, its .sha256 (and index.json, with `bundle index`) go.")
@click.option("--host-root", type=click.Path(path_type=Path), envvar="ROOT_MOUNT_DIR",
              default=HOST_ROOT, show_default=True, show_envvar=True,
              help="Root whose kernel headers are used ('/' on a CI machine or in a Job).")
@click.option("--driver-version", envvar="NVIDIA_DRIVER_VERSION", show_envvar=True,
              help="Driver version [default: Ubuntu's pinned version].")
@click.option("--driver-url", envvar="NVIDIA_DRIVER_DOWNLOAD_URL", show_envvar=True,
              help="Full URL of the NVIDIA .run [default: from --driver-base-url].")
@click.option("--driver-base-url", envvar="NVIDIA_DRIVER_BASE_URL", show_envvar=True,
              help=f"The .run is <base>/<V>/NVIDIA-Linux-<arch>-<V>.run [default: "
              f"{DEFAULT_DRIVER_BASE_URL}]. Not with --driver-url.")
@click.option("--driver-sha256", envvar="NVIDIA_DRIVER_SHA256", show_envvar=True,
              help="Expected SHA-256 of the .run.")
@click.option("--kernel-release", envvar="KERNEL_RELEASE", show_envvar=True,
              help="Target kernel [default: the running kernel].")
@click.option("--kernel-source-path", type=click.Path(path_type=Path),
              envvar="KERNEL_SOURCE_PATH", show_envvar=True,
              help="Its headers [default: under --host-root, else apt-get].")
@click.option("--kernel-module-type", type=click.Choice(MODULE_TYPE_REQUESTS),
              envvar="NVIDIA_KERNEL_MODULE_TYPE", default="auto", show_default=True,
              show_envvar=True, help="auto: NVIDIA's default for the branch (no GPU needed).")
@click.option("--arch", "arch_name", envvar="NVIDIA_BUNDLE_ARCH", show_envvar=True,
              type=click.Choice(ARCH_NAMES),
              help="The nodes' CPU architecture [default: this machine's]; another one is "
              "cross-compiled against its headers (ARCH=arm64 CROSS_COMPILE=aarch64-linux-gnu-; "
              "the .run's nvidia-installer runs through qemu-user-static).")
@click.option("--targets", envvar="NVIDIA_BUNDLE_TARGETS", show_envvar=True,
              help="DRIVER@KERNEL items (space or comma separated); --target-index picks one "
              "(for an Indexed Job: one pod per item).")
@click.option("--target-index", type=int, envvar="JOB_COMPLETION_INDEX", show_envvar=True)
@click.option("--signing-key", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              envvar="NVIDIA_BUNDLE_SIGNING_KEY", show_envvar=True,
              help="Sign the modules with this private key (the kernel's scripts/sign-file).")
@click.option("--signing-cert", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              envvar="NVIDIA_BUNDLE_SIGNING_CERT", show_envvar=True,
              help="The X.509 certificate of --signing-key, enrolled on the nodes.")
@click.option("--compression-level", type=click.IntRange(1, 22), default=19, show_default=True,
              envvar="NVIDIA_BUNDLE_COMPRESSION_LEVEL", show_envvar=True,
              help="zstd's level: 19 is the smallest for every node to fetch; a lower one "
              "builds faster (the format is the same at every level).")
@click.option("--allow-insecure-http", is_flag=True, envvar="ALLOW_INSECURE_HTTP",
              show_envvar=True)
@click.option("--log-format", type=LOG_FORMATS, envvar="LOG_FORMAT", default="auto",
              show_default=True, show_envvar=True)
@click.option("-v", "--verbose", is_flag=True)
def build_command(output_dir: Path, signing_key: Path | None, signing_cert: Path | None,
                  targets: str | None, target_index: int | None, log_format: str,
                  verbose: bool, arch_name: str | None, compression_level: int,
                  **opts: Any) -> None:
    """Compile the driver for a kernel (nothing is loaded) and write one bundle."""
    from installer.base.fsutil import remove_tree
    from installer.commands import bundle_build as build
    from installer.detect import context
    from installer.log import configure
    from installer.plan import execute
    from installer.records.results import BundleWritten
    from installer.settings import Settings, retry_env, validate

    configure(log_format, "debug" if verbose else "info")
    if (signing_key is None) != (signing_cert is None):
        raise UsageError("--signing-key and --signing-cert go together")
    if targets:
        opts["driver_version"], opts["kernel_release"] = pick_target(targets, target_index)
    from installer.net.policy import register_url

    register_url(opts.get("driver_url"))
    output_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".bundle-build-", dir=output_dir))
    try:
        settings = validate(Settings(install_dir=work, **retry_env(os.environ),
                                     **{k: v for k, v in opts.items() if v is not None}))
        ctx = context(settings, arch=cpuarch.from_name(arch_name) if arch_name else None)
        signing = build.Signing(signing_key, signing_cert) if signing_key and signing_cert else None
        plan = build.plan(ctx, output_dir.resolve(), signing, level=compression_level)
        log.info("plan_ready", kind=plan.kind, steps=[s.name for s in plan.steps],
                         **plan.summary)
        execute(plan, ctx, [])
    finally:
        remove_tree(work)
    written = ctx.results.need(BundleWritten).written  # write_bundle: the plan's last step
    click.echo(json.dumps({"bundle": str(written.path), "sha256": written.sha256,
                           **written.manifest.summary()}, indent=2))


@bundle.command("index")
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--prune", is_flag=True, help="Drop entries whose bundle is not in DIRECTORY.")
@click.option("--log-format", type=LOG_FORMATS, envvar="LOG_FORMAT", default="auto",
              show_default=True, show_envvar=True)
def index_command(directory: Path, prune: bool, log_format: str) -> None:
    """Write DIRECTORY/index.json: each bundle's sha256 and what it is for.

    Exit 6 if a bundle there cannot be indexed (unreadable, or its manifest is for
    another name); the others are indexed.
    """
    from installer.base.errors import IntegrityError
    from installer.bundle import index
    from installer.log import configure

    configure(log_format, "info")
    entries, refused = index.update(directory, prune=prune)
    click.echo(json.dumps({"index": str(directory / "index.json"), "bundles": len(entries),
                           "refused": refused}, indent=2))
    if refused:
        raise IntegrityError(f"{len(refused)} bundle(s) not indexed: {refused[0]}",
                             hint="rebuild them with `bundle build`; never rename a bundle",
                             path=str(directory))
