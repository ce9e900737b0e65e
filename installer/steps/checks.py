"""Steps that check the node before anything changes: signing policy, module loading,
the loaded driver, the GPUs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from installer.base import branches
from installer.base.errors import ModuleLoadError, UsageError
from installer.host import gpus
from installer.kmod import modules, signing
from installer.plan import Step
from installer.records.results import GpusChecked

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)


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


def check_gpus(version: str, requested_module_type: str = "auto") -> Step:
    """Refuse, before any download, a driver branch or module type these GPUs cannot use."""

    def run(ctx: Context) -> GpusChecked:
        found = list(ctx.pci_gpus)
        for warning in gpus.unknown(found):
            log.warning("unknown_gpu", message=warning)
        choice = gpus.choose_module_type(found, version, requested_module_type)
        no_gpu = None
        if not found and ctx.settings.dry_run and not ctx.settings.install_only:
            # The real run goes on (a GPU-less VM still proves the kernel accepts the
            # modules) and fails at the load: exit 8. The dry run says so and still shows the
            # plan (a workstation or CI previews it). --install-only loads nothing,
            # so its real run only warns, and so does its dry run.
            no_gpu = (
                f"no NVIDIA GPU on the PCI bus ({ctx.kernel.sys_dir}/bus/pci/devices): here the "
                "real run would build the driver, then fail to load it (exit 8, nvidia.ko: NVRM: "
                "No NVIDIA GPU found.); the plan is the one a node with a GPU gets")
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
        return GpusChecked(choice.module_type, no_gpu)

    return Step("check_gpu_compatibility", run,
                f"NVIDIA GPUs in sysfs support driver {version}; {requested_module_type} "
                "kernel modules", check=True, gives=(GpusChecked,))
