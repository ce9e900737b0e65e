"""Loading and unloading the NVIDIA kernel modules, in dependency order."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import structlog

from installer.base.dataclass import dataclass
from installer.base.errors import ModuleLoadError, SecureBootError
from installer.base.fsutil import sorted_entries
from installer.host.runner import CommandError, Runner
from installer.kmod import signing, xid
from installer.kmod.diagnostics import read_kernel_log
from installer.kmod.kernel import KernelState, module_name
from installer.kmod.modinfo import module_depends, read_modinfo, vermagic_release
from installer.kmod.moduleargs import ModuleArg, for_module

log = structlog.get_logger(__name__)

# nvidia first; uvm and modeset use its symbols; drm uses modeset's.
LOAD_ORDER = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm")
# What a GPU node loads unless asked for more: CUDA and NVML need nvidia and nvidia-uvm
# only, as GKE's Ubuntu installer loads them (container-engine-accelerators
# nvidia-driver-installer/ubuntu/entrypoint.sh) and a real H100 GKE node runs
# (tests/data/gpu-node). nvidia-modeset and nvidia-drm are NVIDIA's display modules (kernel
# mode setting, /dev/dri): --display-modules loads them too (docs/nvidia-facts.md).
COMPUTE_MODULES = ("nvidia", "nvidia-uvm")


def load_order(display_modules: bool) -> tuple[str, ...]:
    """The module files a run loads, in dependency order."""
    return LOAD_ORDER if display_modules else COMPUTE_MODULES
# Every module that holds the driver, in the order they come out: the users of nvidia's
# exported symbols first (NVIDIA/nvidia-installer conflicting-kernel-modules.c: nv_peer_mem,
# nvidia-peermem, nvidia-vgpu-vfio, nvidia-uvm, nvidia-drm, nvidia-modeset, nvidia; NVIDIA's
# k8s-driver-manager unloadDriver() adds GPUDirect Storage's nvidia_fs and GDRCopy's gdrdrv).
NVIDIA_MODULES = ("nv_peer_mem", "nvidia_peermem", "nvidia_fs", "gdrdrv", "nvidia_vgpu_vfio",
                  "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia")
LOAD_TIMEOUT_S = 120
# What a GPU node needs loaded for CUDA, by kernel name: nvidia (nvidiactl, nvidiaN) and
# nvidia-uvm (CUDA's unified memory: without /dev/nvidia-uvm cuInit fails, 999).
REQUIRED_MODULES = tuple(module_name(f) for f in COMPUTE_MODULES)


@dataclass(frozen=True)
class ModuleLoad:
    name: str  # kernel name, e.g. nvidia_uvm
    path: Path
    params: tuple[ModuleArg, ...]
    in_tree_deps: tuple[str, ...]  # e.g. drm_kms_helper for nvidia_drm


def plan_loads(drivers_dir: Path, module_args: tuple[ModuleArg, ...], *,
               display_modules: bool = False) -> list[ModuleLoad]:
    ours = {module_name(f) for f in LOAD_ORDER}
    loads = []
    for file_stem in load_order(display_modules):
        path = drivers_dir / f"{file_stem}.ko"
        if not path.exists():
            continue
        name = module_name(file_stem)
        deps = tuple(d for d in module_depends(read_modinfo(path)) if d not in ours)
        loads.append(ModuleLoad(name, path, for_module(name, module_args), deps))
    return loads


def check_vermagic(path: Path, kernel_release: str) -> None:
    built_for = vermagic_release(read_modinfo(path))
    if built_for and built_for != kernel_release:
        raise ModuleLoadError(
            f"{path.name} was built for kernel {built_for}, the running kernel is {kernel_release}",
            hint="the cache is stale: re-run with --force to rebuild for this kernel",
            path=str(path),
            kernel_release=kernel_release,
        )


def load(
    loads: list[ModuleLoad],
    kernel: KernelState,
    runner: Runner,
    *,
    modprobe_root: Path | None,
    on_loaded: Callable[[str], None] | None = None,
    warn_params: bool = True,
) -> list[str]:
    """insmod each module not already loaded; returns the names loaded now, each also
    handed to ``on_loaded`` as soon as it is in, so a caller can undo a half-done load.
    ``warn_params``: say when a loaded module has other parameters (False: the caller said
    it already)."""
    loaded_now: list[str] = []
    release = kernel.release()
    lockdown = signing.policy(kernel).lockdown
    for item in loads:
        if kernel.is_loaded(item.name):
            log.info("module_already_loaded", module=item.name)
            differ = params_not_applied(kernel, item.name, item.params) if warn_params else None
            if differ:
                log.warning("module_params_not_applied", module=item.name, params=differ,
                            hint="the module is already loaded: run uninstall then install "
                            "(or reboot) to load it with these parameters")
            continue
        check_vermagic(item.path, release)
        for dep in item.in_tree_deps:
            if not kernel.module_present(dep):
                argv = ["modprobe"] + (["-d", str(modprobe_root)] if modprobe_root else []) + [dep]
                _run_load(kernel, runner, argv, dep, release, lockdown)
        words = [p.insmod_word for p in item.params]
        _run_load(kernel, runner, ["insmod", str(item.path), *words], item.name, release,
                  lockdown)
        loaded_now.append(item.name)
        if on_loaded is not None:
            on_loaded(item.name)
        log.info("module_loaded", module=item.name, path=str(item.path), params=words)
    return loaded_now


# nvidia.ko registers every NVreg_* option with permission 0 (open-gpu-kernel-modules
# kernel-open/common/inc/nv-linux.h: NV_MODULE_PARAMETER(x) is module_param(x, int, 0),
# NV_MODULE_STRING_PARAMETER(x) module_param(x, charp, 0); nv-reg.h NV_DEFINE_REG_ENTRY),
# so /sys/module/nvidia/parameters/ does not exist (a real H100 node, 580.159.04). The values
# the driver runs with are in /proc/driver/nvidia/params, without the NVreg_ prefix: numbers
# as "%s: %u", strings as '%s: "%s"' (nv-procfs.c nv_procfs_read_params).
NVIDIA_PARAMS = "driver/nvidia/params"  # under /proc
NVREG = "NVreg_"


def parse_nvidia_params(text: str) -> dict[str, str]:
    """/proc/driver/nvidia/params -> ``{"NVreg_ModifyDeviceFiles": "1", "NVreg_RmMsg": ""}``:
    keys as the module parameters are named, string values unquoted."""
    out = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        out[NVREG + name.strip()] = value
    return out


def loaded_params(kernel: KernelState, module: str) -> dict[str, str] | None:
    """The parameter values a loaded module runs with (None: it is not loaded, or nvidia's
    /proc/driver/nvidia/params cannot be read): nvidia's from /proc/driver/nvidia/params
    (named ``NVreg_X`` as passed to insmod), every other module's from
    /sys/module/<m>/parameters (the readable ones)."""
    module = module_name(module)
    if not kernel.is_loaded(module):
        return None
    if module == "nvidia":
        try:
            return parse_nvidia_params((kernel.proc_dir / NVIDIA_PARAMS).read_text())
        except OSError:
            return None
    found: dict[str, str] = {}
    for entry in sorted_entries(kernel.sys_dir / "module" / module / "parameters"):
        try:
            found[entry.name] = entry.read_text().strip()
        except OSError:  # mode 0200 and the like: not readable
            continue
    return found


def _same_value(want: str, have: str) -> bool:
    """``want`` as insmod takes it, ``have`` as the kernel prints it: the kernel strips the
    quotes (kernel/params.c next_arg), parses numbers with base 0 and prints nvidia's as
    unsigned (nv-procfs.c "%u": -1 reads back 4294967295), bools as Y/N (param_get_bool)."""
    if len(want) >= 2 and want[0] == want[-1] == '"':
        want = want[1:-1]
    if want == have:
        return True
    if have in ("Y", "N"):
        return want in (("1", "y", "Y", "on") if have == "Y" else ("0", "n", "N", "off"))
    try:
        return int(want, 0) % 2**32 == int(have, 0) % 2**32
    except ValueError:
        return False


def params_not_applied(kernel: KernelState, module: str,
                       wanted: tuple[ModuleArg, ...]) -> list[str]:
    """``PARAM=VALUE`` of the ``wanted`` args of ``module`` the loaded module does not run
    with (as the kernel says: loaded_params)."""
    have = loaded_params(kernel, module) or {}
    return [a.insmod_word for a in for_module(module, wanted)
            if a.param not in have or not _same_value(a.value, have[a.param])]


def _run_load(kernel: KernelState, runner: Runner, argv: list[str], name: str, release: str,
              lockdown: str) -> None:
    try:
        runner.run(argv, timeout=LOAD_TIMEOUT_S)
    except CommandError as exc:
        detail = exc.stderr_tail(2)
        # Under kernel lockdown an unsigned module is refused with a bare EPERM.
        locked_out = lockdown != "none" and "Operation not permitted" in detail
        if "Key was rejected" in detail or "Required key not available" in detail or locked_out:
            raise SecureBootError(
                f"the kernel refused unsigned module {name}: {detail}",
                hint="module signatures are enforced on this node: use signed prebuilt modules "
                "or disable enforcement (Secure Boot / module.sig_enforce)",
                kernel_release=release,
            ) from exc
        if "No such device" in detail and name == "nvidia":
            raise _no_gpu_error(kernel, runner, release) from exc
        hint = "see the kernel log (dmesg) for the reason"
        if "Unknown symbol" in detail:
            hint = "a module it depends on is missing or from another driver version; check dmesg"
        elif "Invalid module format" in detail:
            hint = "the module was built for another kernel: re-run with --force"
        raise ModuleLoadError(
            f"failed to load kernel module {name}: {detail}", hint=hint, kernel_release=release
        ) from exc


def _no_gpu_error(kernel: KernelState, runner: Runner, release: str) -> ModuleLoadError:
    """nvidia.ko's init returns ENODEV when it finds no GPU it drives (nv.c,
    ``nvidia_init_module``: ``NVRM: No NVIDIA GPU found.``): everything up to the
    hardware worked, which is worth saying exactly. The driver's own words are the last
    kernel record that starts with ``NVRM:`` (xid.Record.nvrm: never a line someone else
    made the kernel log)."""
    records = read_kernel_log(kernel, runner)
    # From the last successful load on (xid.since_driver_load): an older driver's lines are
    # not what this load said.
    current = xid.since_driver_load(records)[0] if not isinstance(records, str) else []
    nvrm = [r for r in current if r.nvrm]
    said = nvrm[-1].message.removeprefix(xid.NVRM) if nvrm else "No NVIDIA GPU found."
    return ModuleLoadError(
        f"the driver built and the kernel accepted nvidia.ko, but no NVIDIA GPU is attached "
        f"to this node (kernel: NVRM: {said})",
        hint="run this on a node with an NVIDIA GPU (lspci -d 10de:); on a GPU node, check "
        "the GPU is not bound to another driver (vfio-pci) and is supported by this driver",
        kernel_release=release,
        kernel_log=[r.show() for r in nvrm[-5:]],
    )


def loaded_driver_version(kernel: KernelState) -> str | None:
    """The loaded nvidia.ko's version (``/sys/module/nvidia/version``), None when none is."""
    if not kernel.is_loaded("nvidia"):
        return None
    return kernel.module_version("nvidia") or "unknown"


def why_no_load(kernel: KernelState) -> str | None:
    """Why this kernel loads no module until it reboots, None when it may."""
    if kernel.modules_disabled():
        return ("kernel.modules_disabled=1 (/proc/sys/kernel/modules_disabled): the kernel "
                "refuses every module load and unload until it reboots (kernel/module/main.c "
                "may_init_module)")
    return None


def why_no_unload(kernel: KernelState) -> str | None:
    """Why this kernel can unload no module until it reboots, None when it can."""
    disabled = why_no_load(kernel)  # modules_disabled stops unloads as well
    if disabled is None and not kernel.can_unload():
        return ("this kernel cannot unload modules (built without CONFIG_MODULE_UNLOAD: "
                "/proc/modules shows '-' for every refcount; delete_module is ENOSYS)")
    return disabled


def device_holders(proc_dir: Path, limit: int = 100_000) -> list[str]:
    """Processes with an NVIDIA device open: ``pid 1234 (python3) has /dev/nvidia0 open``.

    Needs the host's PID namespace (the DaemonSet runs with hostPID) to see workloads.
    """
    found = []
    for scanned, pid_dir in enumerate(proc_dir.glob("[0-9]*")):
        if scanned >= limit:
            break
        try:
            devices = sorted({
                target for fd in (pid_dir / "fd").iterdir()
                if (target := os.readlink(fd)).startswith("/dev/nvidia")
            })
            if devices:
                comm = (pid_dir / "comm").read_text().strip()
                found.append(f"pid {pid_dir.name} ({comm}) has {', '.join(devices)} open")
        except OSError:  # gone, or not ours to read
            continue
    return found


def users(kernel: KernelState) -> dict[str, list[str]]:
    """Loaded NVIDIA modules that something outside the driver itself holds. Where the
    kernel keeps no refcount (no CONFIG_MODULE_UNLOAD: ``-`` in /proc/modules), the
    processes holding an NVIDIA device file open stand for it, under ``nvidia``."""
    return _users(kernel)[0]


def _users(kernel: KernelState) -> tuple[dict[str, list[str]], bool]:
    """users(), and whether the kernel counted references (False: the processes holding
    device files are in it already)."""
    loaded = kernel.modules()
    busy: dict[str, list[str]] = {}
    uncounted = False
    for name in NVIDIA_MODULES:
        mod = loaded.get(name)
        if mod is None:
            continue
        outside = [u for u in mod.used_by if u not in NVIDIA_MODULES]
        if mod.refcnt is None:
            uncounted = True
            references = 0
        else:
            # References beyond dependent modules: open device files (each open of a
            # character device may hold more than one), kernel users.
            references = mod.refcnt - len(mod.used_by)
        if outside or references > 0:
            busy[name] = outside + ([f"{references} reference(s)"] if references > 0 else [])
    if uncounted:
        opened = device_holders(kernel.proc_dir)
        if opened:
            busy.setdefault("nvidia", []).extend(opened)
    return busy, not uncounted


def ensure_replaceable(kernel: KernelState, want_version: str) -> None:
    """Exit 8 early (before any download) if another loaded driver cannot be unloaded."""
    current = loaded_driver_version(kernel)
    if current is None or current == want_version:
        return
    ensure_unloadable(kernel, f"cannot replace it with {want_version}")
    ensure_unused(kernel, f"cannot replace it with {want_version}")


def ensure_unloadable(kernel: KernelState, refusing: str) -> None:
    """Exit 8 (saying why) when this kernel can unload nothing until it reboots."""
    why = why_no_unload(kernel)
    if why:
        raise ModuleLoadError(
            f"NVIDIA driver {loaded_driver_version(kernel)} is loaded and {why}; {refusing}",
            hint="reboot the node to change the driver (install with --when-in-use stage "
            "keeps the new version for the next boot); the installed driver was left as it is",
        )


def holders(kernel: KernelState) -> str | None:
    """What holds the loaded NVIDIA driver (modules, references, processes), None if unused."""
    busy, counted = _users(kernel)
    if not busy:
        return None
    described = "; ".join(f"{m}: {', '.join(h)}" for m, h in busy.items())
    # Without a refcount _users() already named the processes.
    processes = device_holders(kernel.proc_dir) if counted else []
    return described + ("; " + "; ".join(processes) if processes else "")


@dataclass(frozen=True)
class InUse:
    """The other driver that keeps running while the wanted one waits for the next boot."""

    running_version: str
    holders: str  # what holds it (holders())


def in_use_by_other(kernel: KernelState, want_version: str) -> InUse | None:
    """The loaded driver and what keeps it when one other than ``want_version`` is loaded
    and in use, or the kernel cannot unload it before a reboot; None when none is loaded,
    it is that version, or it can go."""
    current = loaded_driver_version(kernel)
    if current is None or current == want_version:
        return None
    held = holders(kernel) or why_no_unload(kernel)
    return InUse(current, held) if held else None


def ensure_unused(kernel: KernelState, refusing: str) -> None:
    """Exit 8 (naming the holders) if the loaded NVIDIA driver is in use: replace, uninstall."""
    held = holders(kernel)
    if held:
        raise ModuleLoadError(
            f"NVIDIA driver {loaded_driver_version(kernel)} is loaded and in use ({held}); "
            f"{refusing}",
            hint="drain GPU workloads from this node (kubectl drain <node> --ignore-daemonsets) "
            "and re-run; the installed driver was left as it is",
        )


def unload(kernel: KernelState, runner: Runner, only: list[str] | None = None, *,
           on_unloaded: Callable[[str], None] | None = None) -> list[str]:
    """rmmod loaded NVIDIA modules (or just ``only``) in reverse dependency order; each one
    out is handed to ``on_unloaded`` at once (a later rmmod may fail: a caller can then
    load back what went)."""
    loaded = kernel.modules()
    targets = [n for n in NVIDIA_MODULES if n in loaded and (only is None or n in only)]
    if targets:
        ensure_unloadable(kernel, "not unloading it")
    removed = []
    for name in targets:
        try:
            runner.run(["rmmod", name], timeout=LOAD_TIMEOUT_S)
        except CommandError as exc:
            raise ModuleLoadError(
                f"failed to unload kernel module {name}: {exc.stderr_tail(2)}",
                hint="something still uses the GPU: drain GPU workloads and re-run",
            ) from exc
        removed.append(name)
        if on_unloaded is not None:
            on_unloaded(name)
        log.info("module_unloaded", module=name)
    return removed
