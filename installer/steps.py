"""The named steps plans are made of. Each takes the Context; I/O goes through it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from installer import (
    __version__,
    branches,
    cache,
    cgroup_memory,
    cpus,
    devnodes,
    firmware,
    gpus,
    ldcache,
    module_build,
    modules,
    nextboot,
    nvidia_options,
    nvidia_run,
    signing,
    verify,
)
from installer.cache import CacheKey
from installer.errors import (
    BuildError,
    ModuleLoadError,
    UsageError,
    VerifyError,
)
from installer.fsutil import remove_tree
from installer.gke import vulkan_icd
from installer.headers import KernelTree
from installer.installdir import Tree
from installer.kernel import module_name
from installer.net.policy import file_name, local_file
from installer.plan import Step
from installer.runner import CommandError
from installer.workstate import Artifact, InUse

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)


def prepare_staging() -> Step:
    def run(ctx: Context) -> None:
        ctx.install.clear_leftovers()
        ctx.work.staging = ctx.install.new_staging()

    return Step("prepare_staging", run, "build aside in <install-dir>/.staging")


def clear_leftovers() -> Step:
    return Step("clear_leftovers", lambda ctx: ctx.install.clear_leftovers(),
                "remove what a killed run left behind")


def check_module_signing(need_signed: str) -> Step:
    """Stop before any big download when the kernel would reject our unsigned modules."""

    def run(ctx: Context) -> None:
        policy = signing.policy(ctx.kernel)
        if policy.enforced:
            raise signing.refusal(
                policy, need_signed,
                "install from bundles signed with a key enrolled on the nodes (bundle build "
                "--signing-key, --prebuilt-url)", kernel_release=ctx.host_info.kernel_release)

    return Step("check_module_signing", run, "refuse early if unsigned modules cannot load",
                check=True)


def check_module_loading(version: str) -> Step:
    """Stop before any download when the kernel loads no module until it reboots
    (kernel.modules_disabled=1) and this run must load one: checked before signatures,
    which it makes moot. A run whose driver is loaded already needs no load."""

    def run(ctx: Context) -> None:
        why = modules.why_no_load(ctx.kernel)
        if why is None:
            return
        if modules.loaded_driver_version(ctx.kernel) == version and all(
                ctx.kernel.is_loaded(m) for m in modules.REQUIRED_MODULES):
            log.info("module_loading_disabled", reason=why,
                     message=f"driver {version} is loaded already: nothing to load")
            return
        raise ModuleLoadError(
            f"this run must load the NVIDIA {version} kernel modules and {why}",
            hint="the node's image or a boot script sets it (it cannot be unset until "
            "reboot): use a node image that leaves module loading on, or one whose image "
            "loads the driver you want; --install-only installs the files without loading",
            driver_version=version)

    return Step("check_module_loading", run,
                "refuse early if the kernel loads no modules (kernel.modules_disabled)",
                check=True)


def check_loaded_driver(version: str) -> Step:
    def run(ctx: Context) -> None:
        loaded = modules.loaded_driver_version(ctx.kernel)
        if ctx.settings.install_only and loaded not in (None, version):
            raise ModuleLoadError(
                f"NVIDIA driver {loaded} is loaded; --install-only never unloads it, and "
                f"{version}'s libraries under it would fail every GPU program (Driver/library "
                "version mismatch)",
                hint="reboot the node first, or run without --install-only to replace it",
                driver_version=version,
            )
        modules.ensure_replaceable(ctx.kernel, version)
        log.info("loaded_driver", version=loaded, wanted=version)

    return Step("check_loaded_driver", run,
                f"a different loaded driver must be unused (want {version})", check=True)


def take_next_boot(key: CacheKey) -> Step:
    """After the reboot: the version staged for it fills the staging dir (no download, no
    compile) when it is for this node's key; one for anything else is discarded."""

    def run(ctx: Context) -> None:
        ctx.work.from_next_boot = nextboot.take(ctx.install, ctx.work.staged(), key)

    return Step("take_next_boot", run, f"<install-dir>/.next-boot if it holds {key.describe()}")


def stage_next_boot(key: CacheKey, in_use: InUse) -> Step:
    """The checked staging tree kept for the next boot; the running driver untouched."""

    def run(ctx: Context) -> None:
        nextboot.stage(ctx.install, ctx.work.staged(), key)
        ctx.work.staged_for_boot = in_use
        log.warning("driver_staged_for_next_boot", running=in_use.running_version,
                    staged=key.driver_version, holders=in_use.holders,
                    message=f"NVIDIA driver {in_use.running_version} is in use "
                    f"({in_use.holders}): it keeps running; {key.describe()} is staged and "
                    "installs at the next boot (drain and reboot the node to switch now)")

    return Step("stage_next_boot", run, f"keep {key.describe()} in <install-dir>/.next-boot; "
                f"driver {in_use.running_version} stays loaded (in use: {in_use.holders})")


def drop_next_boot(version: str) -> Step:
    """A cache hit: the installed version is the one wanted, so nothing waits for a boot."""

    def run(ctx: Context) -> None:
        nextboot.discard(ctx.install, f"driver {version} is installed and is the one wanted")

    return Step("drop_next_boot", run, "remove <install-dir>/.next-boot if a run left one")


def download_driver(url: str, sha256: str | None) -> Step:
    def run(ctx: Context) -> None:
        from installer.net.transfer import download  # requests: not on a cache hit

        staging = ctx.work.staged()
        dest = staging.root / "downloads" / file_name(url, "driver.run")
        dest.parent.mkdir(parents=True, exist_ok=True)
        result = download(
            ctx.http, url, dest, expected_sha256=sha256,
            allow_insecure_http=ctx.settings.allow_insecure_http, label="driver",
        )
        ctx.work.downloads["driver"] = result
        ctx.work.run_file = result.path

    return Step("download_driver", run, url)


@dataclass(frozen=True)
class Fetch:
    artifact: Artifact  # where the result goes: ctx.work.downloads[artifact]
    url: str
    label: str
    sha256: str | None = None
    into: Path | None = None  # a download dir outside staging (None: <staging>/downloads)


def fetch_artifacts(fetches: tuple[Fetch, ...]) -> Step:
    """Download everything the plan needs at once (download_all: parallel, first failure
    cancels the rest)."""

    def run(ctx: Context) -> None:
        from installer.net.parallel import DownloadJob, download_all  # requests, as above

        for into in sorted({f.into for f in fetches if f.into is not None}):
            # Archives a killed run left (what is extracted from them is kept only when
            # complete); a failing run removes its own.
            remove_tree(into, ignore_errors=True)
            ctx.scratch.append(into)
        jobs = []
        for f in fetches:
            base = f.into or ctx.work.staged().root / "downloads"
            jobs.append(DownloadJob(
                url=f.url, dest=base / file_name(f.url, f.label), expected_sha256=f.sha256,
                label=f.label, allow_insecure_http=ctx.settings.allow_insecure_http,
            ))
        results = download_all(ctx.http, jobs)
        for f, result in zip(fetches, results, strict=True):
            ctx.work.downloads[f.artifact] = result
        if "driver" in ctx.work.downloads:
            ctx.work.run_file = ctx.work.downloads["driver"].path

    detail = "in parallel: " + ", ".join(f.url for f in fetches)
    return Step("fetch_artifacts", run, detail)


EXTRACT_DIR = "extract"  # under the staging dir


def extract_driver(version: str) -> Step:
    def run(ctx: Context) -> None:
        staging = ctx.work.staged()
        # The test seams (empty in production), as for the build: build_driver says why.
        seams = [(path, path) for path in ctx.kernel.seam_env().values()]
        downloaded = ctx.work.downloads.get("driver")
        from_network = downloaded is not None and local_file(downloaded.url) is None
        ctx.work.extract_dir = nvidia_run.extract(
            ctx.runner, ctx.work.run_file, staging.root / EXTRACT_DIR, rw_binds=seams,
            from_network=from_network)
        # A --driver-url naming another driver: refused before anything is unloaded.
        nvidia_run.check_extracted_version(ctx.work.extract_dir, version,
                                           ctx.settings.driver_url)

    argv = nvidia_run.extract_argv("<driver>.run", EXTRACT_DIR)
    return Step("extract_driver", run, f"{' '.join(argv)} (in a sandbox; the staging dir's "
                f"downloads and {EXTRACT_DIR}/ bound in)")


def build_driver(ctx: Context, version: str, module_type: str | None = None, *,
                 userspace_only: bool = False) -> Step:
    """NVIDIA's Makefile builds the modules (unless ``userspace_only``: COS prebuilt),
    then nvidia-installer --no-kernel-module installs user space; both in the sandbox.
    Neither loads anything: module_build.py."""

    release = ctx.host_info.kernel_release
    tree_dir = "" if userspace_only else module_build.build_dir(version, module_type)
    installer_argv = nvidia_options.installer_args(version=version)

    def make_argv(tree: KernelTree) -> list[str]:
        jobs = cgroup_memory.jobs_for(cpus.usable_cpus(), cgroup_memory.memory_limit())
        return module_build.make_argv(f"{nvidia_run.EXTRACT_IN_CHROOT}/{tree_dir}", tree, jobs)

    def run(ctx: Context) -> None:
        staging = ctx.work.staged()
        # What the jail shows besides the image's system dirs, read-only (container
        # path, jail path): the kernel headers (not the host root they sit in) and the
        # COS toolchain dir.
        binds: list[tuple[str, str]] = []
        if not userspace_only and ctx.work.kernel_tree is not None:
            binds += nvidia_run.kernel_tree_binds(ctx.work.kernel_tree)
        toolchain = ctx.work.toolchain
        binds += toolchain.binds if toolchain else ()
        # A kernel-state seam (tests only; empty in production) must mean the same fake
        # kernel inside the jail: the stand-ins record their calls there and would
        # test-load through it if our flow let them (tests/fixtures/README.md).
        seams = ctx.kernel.seam_env()
        env = {**seams, **(toolchain.env if toolchain else {})}
        sandboxed = {"extract_dir": ctx.work.extract_dir, "staging": staging,
                     "kernel_release": release, "binds": binds, "env": env,
                     "rw_binds": [(path, path) for path in seams.values()]}
        try:
            if not userspace_only:
                assert ctx.work.kernel_tree is not None, "the kernel headers are found first"
                nvidia_run.build_modules(ctx.runner, argv=make_argv(ctx.work.kernel_tree),
                                         tree_dir=tree_dir, **sandboxed)
            nvidia_run.install_userspace(ctx.runner, argv=installer_argv, **sandboxed)
        except Exception as exc:
            kept = nvidia_run.keep_failure_log(staging, ctx.install.installer_log)
            if kept is not None and isinstance(exc, BuildError):  # the node's name for it
                exc.hint = f"see {ctx.install.host_view(kept)} on the node for the full log"
            raise

    # What --dry-run shows: both commands, with the headers a later step finds.
    headers = KernelTree(Path("<kernel-source>"), Path("<kernel-output>"))
    make = "" if userspace_only else f"{' '.join(make_argv(headers))}; then "
    return Step("build_driver", run, f"{make}{' '.join(installer_argv)} (NVIDIA {version}, "
                "in the build jail: docs/jail.md)")


def check_staged_modules() -> Step:
    """Every built module must match the running kernel before the working driver goes."""

    def run(ctx: Context) -> None:
        staging = ctx.work.staged()
        release = ctx.kernel.release()
        for ko in sorted(staging.drivers.glob("*.ko")):
            modules.check_vermagic(ko, release)

    return Step("check_staged_modules", run, "vermagic of every built module = running kernel")


def unload_other_driver(version: str) -> Step:
    def run(ctx: Context) -> None:
        loaded = modules.loaded_driver_version(ctx.kernel)
        if loaded is not None and loaded != version:
            modules.ensure_replaceable(ctx.kernel, version)
            removed = modules.unload(ctx.kernel, ctx.runner)
            ctx.work.changes.unloaded_version = loaded
            log.info("old_driver_unloaded", version=loaded, modules=removed)

    return Step("unload_other_driver", run, "rmmod a different, unused driver version")


def gpu_firmware(from_staging: bool) -> Step:
    def run(ctx: Context) -> None:
        tree: Tree = ctx.work.staged() if from_staging else ctx.install
        ctx.work.changes.note_firmware_path(firmware.read_search_path(ctx.kernel))
        firmware.make_findable(ctx.kernel, ctx.host, ctx.install, tree)

    where = "<install-dir-host>/.staging/firmware" if from_staging else "<install-dir-host>/firmware"
    return Step("gpu_firmware", run, f"firmware_class.path = {where} when unset or ours, "
                "else copy to the host's /lib/firmware/updates")


def load_modules(from_staging: bool, display_modules: bool = False) -> Step:
    def run(ctx: Context) -> None:
        tree: Tree = ctx.work.staged() if from_staging else ctx.install
        loads = modules.plan_loads(tree.drivers, ctx.settings.module_args,
                                   display_modules=display_modules)
        # What it loads before a failure is unloaded again by rollback.undo.
        modules.load(loads, ctx.kernel, ctx.runner, modprobe_root=ctx.modprobe_root,
                     loaded_now=ctx.work.changes.loaded)

    where = "<staging>/drivers" if from_staging else "<install-dir>/drivers"
    files = modules.load_order(display_modules)
    return Step("load_modules", run, f"insmod {', '.join(files)} from {where}")


def device_nodes(ctx: Context, from_staging: bool) -> Step:
    def run(ctx: Context) -> None:
        tree: Tree = ctx.work.staged() if from_staging else ctx.install
        ctx.work.changes.note_device_files(ctx.kernel.dev_dir)
        devnodes.create(tree.bin / "nvidia-modprobe", ctx.kernel, ctx.runner,
                        ctx.settings.module_args)

    # Planned before the load: the files of the modules load_modules loads.
    loads = tuple(module_name(f) for f in modules.load_order(ctx.settings.display_modules))
    return Step("device_nodes", run,
                devnodes.plan(ctx.kernel, ctx.settings.module_args, loads).describe())


def verify_staged(version: str | None = None) -> Step:
    def run(ctx: Context) -> None:
        staging = ctx.work.staged()
        gpus = verify.nvidia_smi(staging, ctx.kernel, ctx.runner, lib_dir=staging.lib64)
        verify.check_driver_version(gpus, version)

    return Step("verify_staged", run, "nvidia-smi from the staged install, before it replaces the old one")


def promote() -> Step:
    def run(ctx: Context) -> None:
        ctx.install.promote(ctx.work.staged())
        ctx.work.changes.promoted = True
        log.info("install_promoted", install_dir=str(ctx.install.root))

    return Step("promote", run, "swap the staged bin/ lib64/ drivers/ firmware/ into place")


def container_ld_cache() -> Step:
    def run(ctx: Context) -> None:
        ldcache.update_container(ctx.runner, ctx.install.lib64)

    return Step("container_ld_cache", run, "/etc/ld.so.conf.d/nvidia.conf + ldconfig")


def host_ld_cache() -> Step:
    def run(ctx: Context) -> None:
        ldcache.update_host(ctx.host, ctx.runner, ctx.install.lib64_host())

    return Step("host_ld_cache", run, "one ld.so.conf entry for <install-dir-host>/lib64 + ldconfig -r")


def verify_install(version: str | None = None) -> Step:
    def run(ctx: Context) -> None:
        ctx.work.gpus = verify.nvidia_smi(ctx.install, ctx.kernel, ctx.runner)
        verify.check_driver_version(ctx.work.gpus, version)

    return Step("verify", run, "nvidia-smi")


def record_cache(key: CacheKey) -> Step:
    def run(ctx: Context) -> None:
        bundle = ctx.work.bundle  # its files were verified against the tree: hash once
        known = {rel: (e.sha256, e.size) for rel, e in bundle.files.items()} if bundle else None
        cache.write(ctx.install.cache_file, key, ctx.install.root, __version__, known)
        ctx.install.commit()
        ctx.work.changes.promoted = False
        ctx.work.changes.committed = True  # from here on a failure keeps the new driver
        log.info("cache_recorded", path=str(ctx.install.cache_file), key=key.describe())

    return Step("record_cache", run, f"write .cache for {key.describe()} (last, atomically)")


def check_gpus(version: str, requested_module_type: str = "auto") -> Step:
    """Refuse, before any download, a driver branch or module type these GPUs cannot use."""

    def run(ctx: Context) -> None:
        found = gpus.scan(ctx.kernel.sys_dir)
        for warning in gpus.unknown(found):
            log.warning("unknown_gpu", message=warning)
        choice = gpus.choose_module_type(found, version, requested_module_type)
        ctx.work.kernel_module_type = choice.module_type
        if not found and ctx.settings.dry_run:
            # The real run goes on (a GPU-less VM still proves the kernel accepts the
            # modules) and fails at the load: exit 8, DESIGN §3. A plan is no use here.
            raise ModuleLoadError(
                f"no NVIDIA GPU on the PCI bus ({ctx.kernel.sys_dir}/bus/pci/devices): the "
                "install would build the driver, then fail to load it (nvidia.ko: NVRM: No "
                "NVIDIA GPU found.)",
                hint="run it on a node with an NVIDIA GPU (lspci -d 10de:); the DaemonSet's "
                "node affinity must select GPU nodes only",
                driver_version=version,
            )
        if not found:
            log.warning("no_gpu_found", sys_dir=str(ctx.kernel.sys_dir),
                        hint="nvidia-smi will find no device: check a GPU is attached to this node")
        branch = gpus.branch_problems(found, version)
        if branch:
            lo, hi = gpus.allowed_branches(found)
            example = next((v for v in gpus.FALLBACK_VERSIONS
                            if not gpus.branch_problems(found, v)), None)
            raise UsageError(
                "; ".join(branch),
                hint=f"the GPUs on this node support {gpus.describe_range(lo, hi)}: set "
                "--driver-version (NVIDIA_DRIVER_VERSION) to such a driver"
                + (f", e.g. {example}," if example else "")
                + " or leave it unset to get a supported default",
                driver_version=version,
                gpus=[g.describe() for g in found],
            )
        if choice.problems:
            raise UsageError(
                "; ".join(choice.problems),
                hint="use --kernel-module-type auto (NVIDIA_KERNEL_MODULE_TYPE) to let the "
                "installer pick what these GPUs support",
                driver_version=version,
                gpus=[g.describe() for g in found],
            )
        ended = branches.branch_warning(version)
        if ended:
            log.warning("driver_branch_end_of_life", driver_version=version, message=ended)
        log.info("gpus_checked", gpus=[g.describe() for g in found], driver_version=version,
                 kernel_module_type=choice.module_type, reason=choice.reason)

    return Step("check_gpu_compatibility", run,
                f"NVIDIA GPUs in sysfs support driver {version}; {requested_module_type} "
                "kernel modules", check=True)


def persistence_mode() -> Step:
    """nvidia-smi -pm 1: keeps the driver initialised with no client (optional)."""

    def run(ctx: Context) -> None:
        smi = ctx.install.bin / "nvidia-smi"
        try:
            ctx.runner.run([smi, "-pm", "1"], timeout=verify.SMI_TIMEOUT_S,
                           env=ctx.kernel.seam_env())
        except CommandError as exc:
            ctx.work.persistence_mode = "failed"
            log.warning("persistence_mode_failed",
                        error=exc.stderr_tail(2) or exc.stdout.strip()[-300:],
                        hint="the driver works without it; check nvidia-smi -q for the GPU state")
            return
        ctx.work.persistence_mode = "on"
        log.info("persistence_mode_enabled")

    return Step("persistence_mode", run, "nvidia-smi -pm 1")


def dev_char_links() -> Step:
    """/dev/char links for every NVIDIA device file there at the end of the run: NVML (the
    verify's nvidia-smi, as root) makes /dev/nvidia-caps/nvidia-cap1 and -cap2 on MIG-capable
    GPUs after device_nodes linked its files (a real H100 node, transcript section D). Only
    links; a failure is a warning (the driver works; doctor's dev_char check names it)."""

    def run(ctx: Context) -> None:
        try:
            devnodes.link_char_devices(ctx.kernel.dev_dir)
        except VerifyError as exc:
            log.warning("dev_char_links_failed", error=exc.message, hint=exc.hint)

    return Step("dev_char_links", run, "/dev/char/<major>:<minor> links for every NVIDIA "
                "device file, the nvidia-caps ones nvidia-smi made included")


def after_verify(ctx: Context) -> tuple[Step, ...]:
    """What follows the final nvidia-smi: optional persistence mode, then the /dev/char links
    of every device file made by then."""
    return (*((persistence_mode(),) if ctx.settings.persistence_mode else ()), dev_char_links())


def install_only(ctx: Context, version: str, key: CacheKey | None) -> tuple[Step, ...]:
    """--install-only: the files in place, findable (firmware path, ld caches), recorded.
    Whoever loads the modules runs nvidia-modprobe and nvidia-smi (GKE's confidential-node
    DaemonSets: insmod <install-dir>/drivers/*.ko, then nvidia-modprobe -c0 -u -m)."""
    staged = (check_staged_modules(), *vulkan_icd.steps_for(ctx), promote()) if key else ()
    return (
        *staged,
        gpu_firmware(from_staging=False),
        container_ld_cache(),
        host_ld_cache(),
        *((record_cache(key),) if key else ()),
    )


def apply_module_args() -> Step:
    """A cache hit whose NVIDIA_MODULE_ARGS changed since the driver was loaded this boot:
    unload it (when nothing uses it) so load_modules loads it with the new ones; in use,
    it keeps the old ones until it next loads, and the log says so."""

    def run(ctx: Context) -> None:
        before, wanted = ctx.work.module_args_loaded, ctx.settings.module_args
        if before is None or sorted(before) == sorted(wanted) or not ctx.kernel.is_loaded("nvidia"):
            return
        held = modules.holders(ctx.kernel) or modules.why_no_unload(ctx.kernel)
        if held:
            log.warning("module_args_not_applied", loaded_with=list(before), wanted=list(wanted),
                        holders=held, message=f"the driver cannot be reloaded now ({held}): it keeps the "
                        "module parameters it was loaded with until it next loads (drain and "
                        "re-run install, or reboot)")
            return
        version = modules.loaded_driver_version(ctx.kernel)
        removed = modules.unload(ctx.kernel, ctx.runner)
        ctx.work.changes.unloaded_version = version
        log.info("modules_reloading", reason="NVIDIA_MODULE_ARGS changed", loaded_with=list(before),
                 wanted=list(wanted), modules=removed)

    return Step("apply_module_args", run, "reload the unused driver if NVIDIA_MODULE_ARGS changed")


def load_cached(ctx: Context, version: str) -> tuple[Step, ...]:
    """A cache hit in any flow: load what is installed, ld caches, verify."""
    if ctx.settings.install_only:
        return (clear_leftovers(), check_loaded_driver(version), *install_only(ctx, version, None))
    return (
        clear_leftovers(),
        check_loaded_driver(version),
        unload_other_driver(version),
        apply_module_args(),
        gpu_firmware(from_staging=False),
        load_modules(from_staging=False, display_modules=ctx.settings.display_modules),
        device_nodes(ctx, from_staging=False),
        container_ld_cache(),
        host_ld_cache(),
        verify_install(version),
        *after_verify(ctx),
    )


def stage_for_next_boot(key: CacheKey, in_use: InUse) -> tuple[Step, ...]:
    """--when-in-use stage: the checked build kept for the next boot, the running driver
    verified as it is (its readiness says what is pending)."""
    return (
        check_staged_modules(),
        stage_next_boot(key, in_use),
        container_ld_cache(),  # this container's: nvidia-smi of the running driver resolves
        verify_install(in_use.running_version),
        dev_char_links(),
    )


def activate_staged(ctx: Context, version: str, key: CacheKey) -> tuple[Step, ...]:
    """A fresh build in any flow: load and verify it from staging, swap it in, record it last."""
    if ctx.settings.install_only:
        return install_only(ctx, version, key)
    return (
        check_staged_modules(),
        unload_other_driver(version),
        gpu_firmware(from_staging=True),
        load_modules(from_staging=True, display_modules=ctx.settings.display_modules),
        device_nodes(ctx, from_staging=True),
        verify_staged(version),
        *vulkan_icd.steps_for(ctx),  # reads the extracted .run, which promote() removes
        promote(),
        gpu_firmware(from_staging=False),
        container_ld_cache(),
        host_ld_cache(),
        verify_install(version),
        record_cache(key),
        *after_verify(ctx),
    )
