"""Steps that put a driver in service: unload, load, device files, verify, promote,
record; and the sequences plans share (load a cached install, activate a staged one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from installer import __version__
from installer.base.errors import VerifyError
from installer.host.installdir import Tree
from installer.host.runner import CommandError
from installer.kmod import devnodes, firmware, ldcache, modules
from installer.kmod.kernel import module_name
from installer.plan import Step
from installer.records import cache
from installer.records.cache import CacheKey
from installer.records.journal import (
    DeviceFilesListed,
    FirmwarePathRead,
    InstallCommitted,
    InstallPromoted,
    ModuleLoaded,
    ModuleUnloaded,
    device_files,
)
from installer.records.results import (
    BundleStaged,
    ModuleArgsWaiting,
    PersistenceModeSet,
    Staged,
    StepResult,
    Verified,
)
from installer.services import verify
from installer.steps import fabric as fabric_steps
from installer.steps import vulkan_icd
from installer.steps.checks import check_loaded_driver
from installer.steps.staging import check_staged_modules, clear_leftovers

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)


def unload_other_driver(version: str) -> Step:
    def run(ctx: Context) -> None:
        loaded = modules.loaded_driver_version(ctx.kernel)
        if loaded is not None and loaded != version:
            modules.ensure_replaceable(ctx.kernel, version)
            removed = _unload(ctx, loaded)
            log.info("old_driver_unloaded", version=loaded, modules=removed)

    return Step("unload_other_driver", run, "rmmod a different, unused driver version")


def _staged_if(from_staging: bool) -> tuple[type[StepResult], ...]:
    return (Staged,) if from_staging else ()


def _unload(ctx: Context, version: str | None) -> list[str]:
    """rmmod the loaded driver, each module journaled as it goes: a later rmmod that fails
    leaves the driver half out, and rollback loads it back whole."""
    return modules.unload(ctx.kernel, ctx.runner, on_unloaded=lambda name: ctx.journal.note(
        ModuleUnloaded(name, version)))


def gpu_firmware(from_staging: bool) -> Step:
    def run(ctx: Context) -> None:
        tree: Tree = ctx.results.staging() if from_staging else ctx.install
        ctx.journal.note(FirmwarePathRead(firmware.read_search_path(ctx.kernel)))
        firmware.make_findable(ctx.kernel, ctx.host, ctx.install, tree)

    where = "<install-dir-host>/.staging/firmware" if from_staging else "<install-dir-host>/firmware"
    return Step("gpu_firmware", run, f"firmware_class.path = {where} when unset or ours, "
                "else copy to the host's /lib/firmware/updates", needs=_staged_if(from_staging))


def load_modules(from_staging: bool, display_modules: bool = False) -> Step:
    def run(ctx: Context) -> None:
        tree: Tree = ctx.results.staging() if from_staging else ctx.install
        loads = modules.plan_loads(tree.drivers, ctx.settings.module_args,
                                   display_modules=display_modules)
        # What it loads before a failure is unloaded again by rollback.undo.
        modules.load(loads, ctx.kernel, ctx.runner, modprobe_root=ctx.modprobe_root,
                     on_loaded=lambda name: ctx.journal.note(ModuleLoaded(name)),
                     warn_params=ctx.results.get(ModuleArgsWaiting) is None)

    where = "<staging>/drivers" if from_staging else "<install-dir>/drivers"
    files = modules.load_order(display_modules)
    return Step("load_modules", run, f"insmod {', '.join(files)} from {where}",
                needs=_staged_if(from_staging))


def device_nodes(ctx: Context, from_staging: bool) -> Step:
    def run(ctx: Context) -> None:
        tree: Tree = ctx.results.staging() if from_staging else ctx.install
        ctx.journal.note(DeviceFilesListed(device_files(ctx.kernel.dev_dir)))
        devnodes.create(tree.bin / "nvidia-modprobe", ctx.kernel, ctx.runner,
                        ctx.settings.module_args, on_bus=len(ctx.pci_gpus))

    # Planned before the load: the files of the modules load_modules loads.
    loads = tuple(module_name(f) for f in modules.load_order(ctx.settings.display_modules))
    return Step("device_nodes", run,
                devnodes.planned(ctx.node.nvidia_params, ctx.node.driver_minors,
                                 len(ctx.node.pci_gpus), ctx.settings.module_args,
                                 loads).describe(), needs=_staged_if(from_staging))


def verify_staged(version: str | None = None) -> Step:
    def run(ctx: Context) -> None:
        staging = ctx.results.staging()
        gpus = verify.nvidia_smi(staging, ctx.runner, lib_dir=staging.lib64)
        verify.check_driver_version(gpus, version)

    return Step("verify_staged", run, "nvidia-smi from the staged install, before it replaces "
                "the old one", needs=(Staged,))


def promote() -> Step:
    def run(ctx: Context) -> None:
        ctx.install.promote(ctx.results.staging())
        # After the swap: promote undoes its own half-done swap (installdir.py).
        ctx.journal.note(InstallPromoted())
        log.info("install_promoted", install_dir=str(ctx.install.root))

    return Step("promote", run, "swap the staged bin/ lib64/ drivers/ firmware/ into place",
                needs=(Staged,))


def container_ld_cache() -> Step:
    def run(ctx: Context) -> None:
        ldcache.update_container(ctx.runner, ctx.install.lib64)

    return Step("container_ld_cache", run, "/etc/ld.so.conf.d/nvidia.conf + ldconfig")


def host_ld_cache() -> Step:
    def run(ctx: Context) -> None:
        ldcache.update_host(ctx.host, ctx.runner, ctx.install.lib64_host())

    return Step("host_ld_cache", run, "one ld.so.conf entry for <install-dir-host>/lib64 + ldconfig -r")


def verify_install(version: str | None = None) -> Step:
    def run(ctx: Context) -> Verified:
        gpus = verify.nvidia_smi(ctx.install, ctx.runner)
        verify.check_driver_version(gpus, version)
        return Verified(tuple(gpus), verify.workloads_ready(ctx))

    return Step("verify", run, "nvidia-smi, then CUDA: a context and a memory round trip "
                "on each GPU", gives=(Verified,))


def record_cache(key: CacheKey) -> Step:
    def run(ctx: Context) -> None:
        # A bundle's files were verified against the tree: hashed once.
        staged = ctx.results.get(BundleStaged)
        known = ({rel: (e.sha256, e.size) for rel, e in staged.manifest.files.items()}
                 if staged else None)
        cache.write(ctx.install.cache_file, key, ctx.install.root, __version__, known)
        ctx.install.commit()
        ctx.journal.note(InstallCommitted())  # from here on a failure keeps the new driver
        log.info("cache_recorded", path=str(ctx.install.cache_file), key=key.describe())

    return Step("record_cache", run, f"write .cache for {key.describe()} (last, atomically)")


def persistence_mode() -> Step:
    """nvidia-smi -pm 1: keeps the driver initialised with no client (optional)."""

    def run(ctx: Context) -> PersistenceModeSet:
        smi = ctx.install.bin / "nvidia-smi"
        try:
            ctx.runner.run([smi, "-pm", "1"], timeout=verify.SMI_TIMEOUT_S)
        except CommandError as exc:
            log.warning("persistence_mode_failed",
                        error=exc.stderr_tail(2) or exc.stdout.strip()[-300:],
                        hint="the driver works without it; check nvidia-smi -q for the GPU state")
            return PersistenceModeSet("failed")
        # NVRM on a real 580 node: "Persistence mode is deprecated and will be removed in a
        # future release. Please use nvidia-persistenced instead." (gpu-node/README.md)
        log.warning("persistence_mode_enabled", deprecated="NVIDIA replaces nvidia-smi -pm 1 "
                    "with nvidia-persistenced: manifests render --persistenced runs it")
        return PersistenceModeSet("on")

    return Step("persistence_mode", run, "nvidia-smi -pm 1", gives=(PersistenceModeSet,))


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

    def run(ctx: Context) -> ModuleArgsWaiting | None:
        before, wanted = ctx.journal.module_args_loaded, ctx.settings.module_args
        if before is None or not ctx.kernel.is_loaded("nvidia"):
            return None  # loaded by someone else (no record this boot): not reloaded on a guess
        # What the kernel runs with (modules.loaded_params), and what was asked for at the
        # last load and is not now (its default is the kernel's to know).
        differ = [f"{m}.{w}" for m in dict.fromkeys(a.module for a in wanted)
                  for w in modules.params_not_applied(ctx.kernel, m, wanted)]
        dropped = [str(a) for a in before if a not in wanted]
        if not differ and not dropped:
            return None
        held = modules.holders(ctx.kernel) or modules.why_no_unload(ctx.kernel)
        if held:
            # Said once, here: load_modules stays quiet when it reads this result.
            log.warning("module_args_not_applied", loaded_with=list(map(str, before)),
                        wanted=list(map(str, wanted)), not_applied=differ, dropped=dropped,
                        holders=held, message=f"the driver cannot be reloaded now ({held}): it "
                        "keeps the module parameters it was loaded with until it next loads: "
                        "drain its GPU work and re-run install (an unused driver is reloaded "
                        "with them), or reboot")
            return ModuleArgsWaiting(held)
        removed = _unload(ctx, modules.loaded_driver_version(ctx.kernel))
        log.info("modules_reloading", reason="NVIDIA_MODULE_ARGS changed", not_applied=differ,
                 dropped=dropped, modules=removed)
        return None

    return Step("apply_module_args", run, "reload the unused driver if NVIDIA_MODULE_ARGS "
                "changed", gives=(ModuleArgsWaiting,))


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
        *fabric_steps.for_node(ctx, version),
        verify_install(version),
        *after_verify(ctx),
    )


def activate_staged(ctx: Context, version: str, key: CacheKey,
                    load: Step | None = None) -> tuple[Step, ...]:
    """A fresh build in any flow: load and verify it from staging, swap it in, record it last.
    ``load``: the flow's own step loading the staged modules (None: ``load_modules``)."""
    if ctx.settings.install_only:
        return install_only(ctx, version, key)
    return (
        check_staged_modules(),
        unload_other_driver(version),
        gpu_firmware(from_staging=True),
        load or load_modules(from_staging=True, display_modules=ctx.settings.display_modules),
        device_nodes(ctx, from_staging=True),
        verify_staged(version),
        *vulkan_icd.steps_for(ctx),  # reads the extracted .run, which promote() removes
        promote(),
        gpu_firmware(from_staging=False),
        container_ld_cache(),
        host_ld_cache(),
        *fabric_steps.for_node(ctx, version),
        verify_install(version),
        record_cache(key),
        *after_verify(ctx),
    )
