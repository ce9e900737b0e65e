"""Host detection, the step between settings and the plan: what OS, kernel and install
dir this node has, as a ``Context``; and the ``detect`` command, which prints it."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

from installer import distros
from installer.base import branches, cpuarch
from installer.base.errors import UnsupportedHostError, UsageError, clip
from installer.base.values import is_kernel_release
from installer.context import Context, NodeProbe
from installer.driver.nvidia_urls import named_arch
from installer.host import gpus
from installer.host.gpus import PciGpu
from installer.host.hostroot import HostRoot
from installer.host.installdir import locate
from installer.host.osinfo import HostInfo
from installer.host.runner import Runner
from installer.kmod import devnodes, modules, signing
from installer.kmod.kernel import KernelState
from installer.kmod.moduleargs import ModuleArg
from installer.kmod.modules import loaded_driver_version
from installer.net.policy import UrlPolicy
from installer.records import cache
from installer.services import fabric
from installer.settings import Settings


def context(settings: Settings, kernel: KernelState | None = None, runner: Runner | None = None,
            *, strict: bool = True, arch: cpuarch.CpuArch | None = None) -> Context:
    """The one way every command (and every test) builds its context.

    ``kernel`` and ``runner`` are the seams tests replace. Not ``strict``: a host whose OS
    cannot be told gets ``HostInfo.unknown`` instead of an error (doctor and uninstall
    still work there).
    """
    # The one reading of --allow-insecure-http: the URLs given are checked before anything
    # else, and the run's HTTP session carries the policy to every URL found later.
    url_policy = UrlPolicy(settings.allow_insecure_http)
    for url in filter(None, (settings.driver_url, settings.driver_base_url,
                             settings.prebuilt_url)):
        url_policy.check(url)
    host = HostRoot(settings.host_root)
    kernel = kernel or KernelState()
    release = settings.kernel_release or kernel.release()
    try:
        host_info = _host_info(host, kernel, release)
    except UnsupportedHostError:
        if strict:
            raise
        host_info = HostInfo.unknown(release)
    # Child processes see the same kernel as we do (the seams: tests only, empty on a node).
    runner = runner or Runner(env=kernel.seam_env())
    # ``arch``: another architecture than the machine's (``bundle build --arch``: the
    # architecture the bundle is for; the machine's own must still be known).
    machine_arch, found = _arch(kernel, strict), None
    arch = arch or machine_arch
    _check_driver_url_arch(settings, arch)
    if arch is not cpuarch.X86_64:  # x86_64: no Grace part, the PCI scan stays lazy
        found = tuple(gpus.scan(kernel.sys_dir))
        settings = with_grace_defaults(settings, found)
    return Context(settings=settings, host=host, kernel=kernel, runner=runner,
                   install=locate(settings.host_root, settings.install_dir,
                                  settings.install_dir_host),
                   host_info=host_info, url_policy=url_policy,
                   arch=arch, _pci_gpus=found)


def _arch(kernel: KernelState, strict: bool) -> cpuarch.CpuArch:
    """The node's architecture; not ``strict`` (doctor, uninstall): x86_64's names for
    one the installer does not know, as for an OS it cannot tell."""
    try:
        return cpuarch.from_machine(kernel.machine())
    except UnsupportedHostError:
        if strict:
            raise
        return cpuarch.X86_64


def _check_driver_url_arch(settings: Settings, arch: cpuarch.CpuArch) -> None:
    """--driver-url naming the other architecture's .run: refused before anything is
    fetched (its modules would not load, its binaries would not run here)."""
    named = named_arch(settings.driver_url) if settings.driver_url else None
    if named and named != arch.nvidia:
        raise UsageError(f"--driver-url names an {named} driver, and this node is {arch}",
                         hint=f"give the URL of NVIDIA-Linux-{arch.nvidia}-<V>.run")


def with_grace_defaults(settings: Settings, found: tuple[PciGpu, ...]) -> Settings:
    """On a Grace superchip node, ``nvidia.NVreg_CoherentGPUMemoryMode=driver`` (CDMM)
    unless the operator chose a mode: the GPU's memory stays the driver's instead of
    becoming a NUMA node the kubelet would count as the node's RAM, and the mode is the
    same on every branch (unset means "numa" up to 595: gpus.CDMM_PARAM). Only where the
    driver has the option (gpus.has_cdmm_option: 580.65.06+; the distro's default when
    --driver-version names no version)."""
    version = settings.driver_version
    if not (version and version[:1].isdigit()):
        version = branches.RECOMMENDED_VERSION
    given = any(a.module == "nvidia" and a.param == gpus.CDMM_PARAM
                for a in settings.module_args)
    if given or not gpus.grace_parts(found) or not gpus.has_cdmm_option(version):
        return settings
    cdmm = ModuleArg("nvidia", gpus.CDMM_PARAM, "driver")
    return dataclasses.replace(settings, module_args=(*settings.module_args, cdmm))


def probe(ctx: Context) -> Context:
    """``ctx`` with its node probe (context.NodeProbe): everything planning reads of the
    node, read here once. install calls it under the lock, after which nothing else may
    change the install dir or the driver."""
    ctx = _with_assumed_gpu(ctx)
    s, kernel = ctx.settings, ctx.kernel
    loaded = loaded_driver_version(kernel)
    may_stay = loaded is not None and not s.install_only and (
        s.when_in_use == "stage" or not kernel.can_unload())
    held = (modules.holders(kernel) or modules.why_no_unload(kernel)) if may_stay else None
    return replace(ctx, probe=NodeProbe(
        pci_gpus=ctx.assumed_gpus or ctx.pci_gpus, fabric_present=fabric.detect(kernel.sys_dir).present,
        installed=cache.read(ctx.install.cache_file), loaded_driver=loaded, held_by=held,
        signing=signing.policy(kernel), nvidia_params=devnodes.read_params(kernel),
        driver_minors=devnodes.driver_minors(kernel)))


def _with_assumed_gpu(ctx: Context) -> Context:
    """--dry-run --gpu-model: ``ctx`` planning one GPU of that model, never mixed with the
    node's own (a GPU of another model on the bus: exit 2; the named one: nothing assumed).
    A Grace part brings its CDMM default (with_grace_defaults) as on its own node."""
    name = ctx.settings.dry_run_gpu_model
    if name is None:
        return ctx
    assumed = gpus.assumed_gpu(name)
    real = ctx.pci_gpus
    if real and all(g.device_id == assumed.device_id for g in real):
        return ctx
    if real:
        raise UsageError(
            f"--gpu-model {name!r} names {assumed.name}, and this node has "
            f"{', '.join(g.describe() for g in real)}: a plan for both would match neither",
            hint="drop --gpu-model (NVIDIA_DRY_RUN_GPU_MODEL) to preview this node's plan, "
            "or run the dry run on a machine without an NVIDIA GPU")
    settings = with_grace_defaults(ctx.settings, (assumed,))
    return replace(ctx, settings=settings, assumed_gpus=(assumed,))


def _host_info(host: HostRoot, kernel: KernelState, release: str) -> HostInfo:
    if not is_kernel_release(release):  # --kernel-release is checked in settings
        raise UnsupportedHostError(
            f"the running kernel's release {clip(release)!r} (uname -r) is not a "
            "kernel release: it names the headers, modules and cache to use",
            hint="pass the node's real release with --kernel-release (KERNEL_RELEASE), "
            f"or check {kernel.proc_dir}/sys/kernel/osrelease",
            kernel_release=clip(release))
    return distros.detect(host, release)


def run(settings: Settings) -> dict[str, object]:
    """The ``detect`` command's report."""
    ctx = context(settings)
    info = ctx.host_info
    host = {k: v for k, v in info.to_dict().items() if k != "distro"}  # "flow" says it
    return {
        **host,
        "arch": ctx.arch.machine,
        "flow": info.distro,
        "support": distros.support(info),
        "install_dir": str(ctx.install.root),
        "signatures_enforced": signing.policy(ctx.kernel).enforced,
        # kernel.modules_disabled=1: nothing loads or unloads until reboot; False without
        # CONFIG_MODULE_UNLOAD ("- -" in /proc/modules): a loaded driver stays until reboot.
        "modules_disabled": ctx.kernel.modules_disabled(),
        "module_unload": ctx.kernel.can_unload(),
        "loaded_driver_version": loaded_driver_version(ctx.kernel),
        "gpus": [g.to_dict() for g in ctx.pci_gpus],
    }
