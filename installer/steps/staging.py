"""Steps that fill the staging dir: clear it, download, extract, build, check the built modules."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from installer.base import cpuarch
from installer.base.cpuarch import CpuArch
from installer.base.dataclass import dataclass
from installer.base.errors import BuildError
from installer.base.fsutil import remove_tree
from installer.driver import nvidia_options
from installer.kmod import modules
from installer.kmod.headers import KernelTree
from installer.net.policy import file_name, local_file
from installer.plan import Step
from installer.records.journal import ScratchDir
from installer.records.results import (
    Artifact,
    Extracted,
    Fetched,
    HeadersReady,
    Staged,
    ToolchainReady,
)

if TYPE_CHECKING:
    from installer.context import Context


def prepare_staging() -> Step:
    def run(ctx: Context) -> Staged:
        ctx.install.clear_leftovers()
        return Staged(ctx.install.new_staging())

    return Step("prepare_staging", run, "build aside in <install-dir>/.staging", gives=(Staged,))


def clear_leftovers() -> Step:
    return Step("clear_leftovers", lambda ctx: ctx.install.clear_leftovers(),
                "remove what a killed run left behind")


def download_driver(url: str, sha256: str | None) -> Step:
    # Only a plan that downloads and builds makes this step: a cache hit (every boot)
    # loads none of the network, .run and jail modules it needs.
    from installer.net.transfer import download

    def run(ctx: Context) -> Fetched:
        dest = ctx.results.staging().root / "downloads" / file_name(url, "driver.run")
        dest.parent.mkdir(parents=True, exist_ok=True)
        result = download(
            ctx.http, url, dest, expected_sha256=sha256, label="driver",
        )
        return Fetched({"driver": result})

    return Step("download_driver", run, url, needs=(Staged,), gives=(Fetched,))


@dataclass(frozen=True)
class Fetch:
    artifact: Artifact  # its key in the step's Fetched result
    url: str
    label: str
    sha256: str | None = None
    into: Path | None = None  # a download dir outside staging (None: <staging>/downloads)


def fetch_artifacts(fetches: tuple[Fetch, ...]) -> Step:
    """Download everything the plan needs at once (download_all: parallel, first failure
    cancels the rest)."""
    # Only a plan that downloads and builds makes this step: a cache hit (every boot)
    # loads none of the network, .run and jail modules it needs.
    from installer.net.parallel import DownloadJob, download_all

    def run(ctx: Context) -> Fetched:
        for into in sorted({f.into for f in fetches if f.into is not None}):
            # Archives a killed run left (what is extracted from them is kept only when
            # complete); a failing run removes its own.
            remove_tree(into, ignore_errors=True)
            ctx.journal.note(ScratchDir(into))
        jobs = []
        for f in fetches:
            base = f.into or ctx.results.staging().root / "downloads"
            jobs.append(DownloadJob(
                url=f.url, dest=base / file_name(f.url, f.label), expected_sha256=f.sha256,
                label=f.label,
            ))
        results = download_all(ctx.http, jobs)
        return Fetched({f.artifact: result for f, result in zip(fetches, results, strict=True)})

    detail = "in parallel: " + ", ".join(f.url for f in fetches)
    in_staging = any(f.into is None for f in fetches)
    return Step("fetch_artifacts", run, detail, needs=(Staged,) if in_staging else (),
                gives=(Fetched,))

EXTRACT_DIR = "extract"  # under the staging dir


def extract_driver(version: str) -> Step:
    # Only a plan that downloads and builds makes this step: a cache hit (every boot)
    # loads none of the network, .run and jail modules it needs.
    import installer.driver.nvidia_run as nvidia_run

    def run(ctx: Context) -> Extracted:
        staging = ctx.results.staging()
        # The test seams (empty in production), as for the build: build_driver says why.
        seams = [(path, path) for path in ctx.runner.env.values()]
        downloaded = ctx.results.download("driver")
        if downloaded is None:
            raise LookupError("no step before extract_driver fetched the .run")
        from_network = local_file(downloaded.url) is None
        extract_dir = nvidia_run.extract(
            ctx.runner, downloaded.path, staging.root / EXTRACT_DIR, rw_binds=seams,
            from_network=from_network)
        # A --driver-url naming another driver: refused before anything is unloaded.
        nvidia_run.check_extracted_version(extract_dir, version, ctx.settings.driver_url)
        return Extracted(extract_dir)

    argv = nvidia_run.extract_argv("<driver>.run", EXTRACT_DIR)
    return Step("extract_driver", run, f"{' '.join(argv)} (in a sandbox; the staging dir's "
                f"downloads and {EXTRACT_DIR}/ bound in)", needs=(Staged, Fetched),
                gives=(Extracted,))


def build_driver(ctx: Context, version: str, module_type: str | None = None, *,
                 userspace_only: bool = False, cross: CpuArch | None = None) -> Step:
    """NVIDIA's Makefile builds the modules (unless ``userspace_only``: COS prebuilt),
    then nvidia-installer --no-kernel-module installs user space; both in the sandbox.
    Neither loads anything: module_build.py. ``cross``: the target architecture of a
    cross build (``bundle build --arch``), whose nvidia-installer must run here."""
    # Only a plan that downloads and builds makes this step: a cache hit (every boot)
    # loads none of the network, .run and jail modules it needs.
    import installer.driver.module_build as module_build
    import installer.driver.nvidia_run as nvidia_run

    release = ctx.host_info.kernel_release
    tree_dir = "" if userspace_only else module_build.build_dir(version, module_type)
    installer_argv = nvidia_options.installer_args(version=version)

    def make_argv(tree: KernelTree) -> list[str]:
        return _make_argv(tree_dir, tree, cross)

    def run(ctx: Context) -> None:
        staging = ctx.results.staging()
        # The plan gives HeadersReady before this step unless userspace_only (``needs``).
        headers_tree = None if userspace_only else ctx.results.need(HeadersReady).tree
        toolchain_ready = ctx.results.get(ToolchainReady)
        # What the jail shows besides the image's system dirs, read-only (container
        # path, jail path): the kernel headers (not the host root they sit in) and the
        # COS toolchain dir.
        binds: list[tuple[str, str]] = []
        if headers_tree is not None:
            binds += nvidia_run.kernel_tree_binds(headers_tree)
        toolchain = toolchain_ready.toolchain if toolchain_ready else None
        binds += toolchain.binds if toolchain else ()
        # A kernel-state seam (tests only; empty in production) must mean the same fake
        # kernel inside the jail: the stand-ins record their calls there and would
        # test-load through it if our flow let them (tests/fixtures/README.md).
        env = dict(toolchain.env) if toolchain else {}
        extract_dir = ctx.results.need(Extracted).extract_dir
        if cross is not None:  # before minutes of make: nvidia-installer must run after it
            nvidia_run.check_runs_here(extract_dir / "nvidia-installer",
                                       cpuarch.from_machine(ctx.kernel.machine()))
        jail = nvidia_run.BuildJail(
            extract_dir=extract_dir, staging=staging, kernel_release=release,
            binds=binds, env=env, rw_binds=[(path, path) for path in ctx.runner.env.values()])
        try:
            if headers_tree is not None:
                nvidia_run.build_modules(ctx.runner, jail, argv=make_argv(headers_tree),
                                         tree_dir=tree_dir)
            nvidia_run.install_userspace(ctx.runner, jail, argv=installer_argv)
        except Exception as exc:
            kept = nvidia_run.keep_failure_log(staging, ctx.install.installer_log)
            if kept is not None and isinstance(exc, BuildError):  # the node's name for it
                exc.hint = f"see {ctx.install.host_view(kept)} on the node for the full log"
            raise

    # What --dry-run shows: both commands, with the headers a later step finds.
    headers = KernelTree(Path("<kernel-source>"), Path("<kernel-output>"))
    make = "" if userspace_only else f"{' '.join(make_argv(headers))}; then "
    needs = (Staged, Extracted) + (() if userspace_only else (HeadersReady,))
    return Step("build_driver", run, f"{make}{' '.join(installer_argv)} (NVIDIA {version}, "
                "in the build jail: docs/jail.md)", needs=needs)


def _make_argv(tree_dir: str, tree: KernelTree, cross: CpuArch | None) -> list[str]:
    """NVIDIA's make command line, -j from the pod's CPUs and memory (its cgroup)."""
    # A build's only (build_driver says why these load here).
    import installer.driver.module_build as module_build
    import installer.driver.nvidia_run as nvidia_run
    import installer.jail.cgroup_memory as cgroup_memory
    import installer.jail.cpus as cpus  # the pod's CPUs, for -j

    jobs = cgroup_memory.jobs_for(cpus.usable_cpus(), cgroup_memory.memory_limit())
    return module_build.make_argv(f"{nvidia_run.EXTRACT_IN_CHROOT}/{tree_dir}", tree, jobs,
                                  cross=cross)


def check_staged_modules() -> Step:
    """Every built module must match the running kernel before the working driver goes."""

    def run(ctx: Context) -> None:
        staging = ctx.results.staging()
        release = ctx.kernel.release()
        for ko in sorted(staging.drivers.glob("*.ko")):
            modules.check_vermagic(ko, release)

    return Step("check_staged_modules", run, "vermagic of every built module = running kernel",
                needs=(Staged,))
