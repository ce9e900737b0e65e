"""Checks of the running driver: kernel modules, GPU firmware, device files, nvidia-smi,
the host's and the image's library caches."""

from __future__ import annotations

from pathlib import PurePosixPath

from installer.base.errors import InstallerError
from installer.commands.doctor.installed import failed_upgrade
from installer.commands.doctor.node import (
    DRAIN,
    FAIL,
    INSTALL_AGAIN,
    INSTALL_FIRST,
    LIBS,
    OK,
    WARN,
    Finding,
    Node,
)
from installer.host.runner import CommandError
from installer.kmod import devchar, devnodes, firmware, ldcache, modules
from installer.services.verify import check_driver_version


def check_kernel_modules(n: Node) -> Finding:
    # Loaded as modules per /sys/module/<m>/initstate, whatever /proc/modules prints.
    ours = [m for m in modules.NVIDIA_MODULES if n.kernel.is_loaded(m)]
    version = n.loaded_version
    if version is None:
        return Finding("kernel_modules", FAIL, "no NVIDIA kernel module is loaded",
                       "run install (after a reboot it loads the cached driver in seconds)")
    detail = f"driver {version} loaded ({', '.join(ours)})"
    # Without CONFIG_MODULE_UNLOAD ("-" refcounts) users() names the processes holding
    # /dev/nvidia* open instead; nothing can be unloaded before a reboot.
    busy = modules.users(n.kernel)
    held = "; ".join(f"{m}: {', '.join(h)}" for m, h in busy.items())
    use = f"in use by {held}" if held else "not in use"
    stuck = not n.kernel.can_unload()
    if stuck:
        use += "; this kernel cannot unload modules (built without module unload support)"
    if n.node_image_driver:
        detail += " by the node image"
    cached = n.record.driver_version if n.record else None
    # With a version staged for the next boot, the running one is what the last run kept.
    wanted = n.status.driver_version if n.status else None
    upgrade = failed_upgrade(n)
    if upgrade is not None:  # the old driver is whole: no library/module mismatch
        fix = DRAIN if busy else upgrade.fix
        return Finding("kernel_modules", WARN, f"{detail}, the one the install dir holds: it "
                       f"works; {upgrade.what}; {use}", fix)
    for other, label in ((cached, "the install dir holds"), (wanted, "the last run wanted")):
        if other and version != other:
            fix = ("reboot the node: this kernel cannot unload the running driver" if stuck
                   else DRAIN if busy else f"{n.rerun_install}: the old driver is unused, so it is "
                   "unloaded and replaced")
            return Finding("kernel_modules", FAIL, f"{detail}, but {label} {other} (libraries "
                           f"and kernel module differ: NVML 'Driver/library version mismatch'); "
                           f"{use}", fix)
    if "nvidia_uvm" not in ours:
        return Finding("kernel_modules", FAIL, f"{detail}; nvidia_uvm is not loaded: CUDA "
                       "cannot start", f"{n.rerun_install} (it loads nvidia-uvm)")
    return Finding("kernel_modules", OK, f"{detail}; {use}")


def check_gpu_firmware(n: Node) -> Finding:
    if n.record is None and n.loaded_version is None:
        # No driver here, so no firmware of one: not "ok" (the install's checks say why).
        return Finding("gpu_firmware", FAIL, f"no driver installed in {n.install.host_path}: "
                       "no GSP firmware for the kernel to find",
                       INSTALL_AGAIN if n.uninstalled else INSTALL_FIRST)
    ok, detail = firmware.findable(n.kernel, n.host, n.install)
    if ok:
        return Finding("gpu_firmware", OK, detail)
    return Finding("gpu_firmware", FAIL, detail + ": GSP-RM GPUs (Turing and newer) fail "
                   "RmInitAdapter and nvidia-smi finds no device",
                   f"{n.rerun_install} (it sets firmware_class.path to <install-dir-host>/firmware, "
                   "or copies the files to the host's /lib/firmware/updates when another path "
                   "is set)")


def check_device_nodes(n: Node) -> Finding:
    dev = n.kernel.dev_dir
    # nvidiactl, one /dev/nvidia<minor> per GPU as the driver numbers them, the uvm ones,
    # and modeset's when it is loaded.
    minors, loaded = devnodes.gpu_minors(n.kernel), devnodes.loaded_modules(n.kernel)
    present = {d.rel: d for d in devchar.nvidia_char_devices(dev)}
    missing = devnodes.missing_nodes(n.kernel)  # what verify finds missing too
    not_chr = [w for w in missing if (dev / w).exists()]
    # /dev/nvidia-caps/* keep NVIDIA's own modes: 0400 for the MIG "config" capability
    # (admin only), 0444 for "monitor" (open-gpu-kernel-modules os.c osRmCapRegisterSys;
    # NVreg_DeviceFileMode does not apply): 0666 would hand every container MIG config.
    closed = [d.rel for d in present.values()
              if d.mode & 0o666 != 0o666 and not d.rel.startswith(devchar.CAPS_DIR + "/")]
    caps = sorted(r for r in present if r.startswith(devchar.CAPS_DIR + "/"))
    detail = ", ".join(f"/dev/{r}" for r in sorted(present) if "/" not in r) or "none"
    caps_detail = ""
    if caps:
        modes = ", ".join(f"{r.rsplit('/', 1)[-1]} {present[r].mode:04o}" for r in caps)
        caps_detail = (f"; {len(caps)} MIG capability node(s) in /dev/nvidia-caps ({modes}: "
                       "NVIDIA's own modes)")
    if missing:
        what = ", ".join(f"/dev/{m}" for m in missing)
        if not_chr:
            what += f" ({', '.join(not_chr)} exist but are not character devices)"
        by_hand = ", then ".join("nvidia-modprobe " + " ".join(a)
                                 for a in devnodes.modprobe_invocations(minors, loaded))
        return Finding("device_nodes", FAIL, f"missing: {what} (present: {detail}{caps_detail})",
                       n.rerun_install + (f", or on the node: {by_hand}" if by_hand else ""))
    if closed:
        return Finding("device_nodes", WARN, f"{detail}{caps_detail}; not mode 0666: "
                       f"{', '.join('/dev/' + c for c in closed)}",
                       "containers not running as root cannot open them: chmod 0666, or set "
                       "nvidia.NVreg_DeviceFileMode=0666 with --module-arg")
    return Finding("device_nodes", OK, f"{detail} (mode 0666){caps_detail}")


def check_dev_char(n: Node) -> Finding:
    states = devchar.check(n.kernel.dev_dir)
    if not states:
        return Finding("dev_char_symlinks", WARN, "no NVIDIA device nodes to link",
                       "fix device_nodes first")
    bad = [s for s in states if s.problem]
    if bad:
        listed = ", ".join(f"/dev/char/{s.device.link_name} ({s.device.rel}) {s.problem}"
                           for s in bad)
        if n.node_image_driver:
            return Finding("dev_char_symlinks", FAIL, listed + f" (driver {n.loaded_version} "
                           "was loaded by the node image, not by this tool)",
                           "making them is the node image's job (or its GPU set-up's): on the "
                           "node, nvidia-ctk system create-dev-char-symlinks --create-all; "
                           "without them GPU containers fail with 'Failed to initialize NVML: "
                           "Unknown Error' after systemctl daemon-reload")
        return Finding("dev_char_symlinks", FAIL, listed,
                       f"{n.rerun_install} (it creates them), or: nvidia-ctk system "
                       "create-dev-char-symlinks --create-all; without them GPU containers fail "
                       "with 'Failed to initialize NVML: Unknown Error' after systemctl "
                       "daemon-reload")
    return Finding("dev_char_symlinks", OK, f"{len(states)} link(s) in /dev/char")


def check_nvidia_smi(n: Node) -> Finding:
    if not (n.install.bin / "nvidia-smi").is_file():
        return Finding("nvidia_smi", FAIL, "not run: no bin/nvidia-smi in the install dir",
                       "fix install_dir first")
    if n.loaded_version is None:
        return Finding("nvidia_smi", FAIL, "not run: the nvidia module is not loaded",
                       "fix kernel_modules first")
    try:
        found = n.smi()
        if isinstance(found, InstallerError):
            raise found
        if n.record and n.record.driver_version:
            check_driver_version(found, n.record.driver_version)
    except InstallerError as exc:
        return Finding("nvidia_smi", FAIL, exc.message, exc.hint or "")
    names = ", ".join(f"{g.name} ({g.bus_id})" for g in found)
    return Finding("nvidia_smi", OK, f"driver {found[0].driver_version if found else '?'}: "
                   f"{names or 'no GPUs listed'}")


def check_host_ld_cache(n: Node) -> Finding:
    cache_file = n.host.path("/etc/ld.so.cache")
    lib_dir = n.install.lib64_host()
    fix = (f"{n.rerun_install}: it puts {lib_dir} in /etc/ld.so.conf.d/nvidia.conf and runs "
           "ldconfig -r on the host; workloads can also set "
           "LD_LIBRARY_PATH=/usr/local/nvidia/lib64")
    if not cache_file.is_file():
        return Finding("host_ld_cache", FAIL, "the host has no /etc/ld.so.cache", fix)
    try:
        entries = ldcache.host_entries(n.host, n.runner)
    except CommandError as exc:
        return Finding("host_ld_cache", FAIL, f"cannot read the host ld cache: "
                       f"{exc.stderr_tail(2)}", fix)
    if n.node_image_driver:
        return _image_ld_cache(n, entries)
    problems, good = [], []
    for lib in LIBS:
        paths = entries.get(lib, [])
        ours = [p for p in paths if PurePosixPath(p).parent == lib_dir]
        if not paths:
            problems.append(f"{lib} is not in the host ld cache")
        elif not ours:
            problems.append(f"{lib} resolves to {paths[0]}, not {lib_dir}")
        elif paths[0] not in ours:
            problems.append(f"{lib} resolves to {paths[0]} before {ours[0]}")
        elif not n.host.resolve(ours[0]).exists():
            problems.append(f"{lib} => {ours[0]}, which does not exist")
        else:
            good.append(f"{lib} => {ours[0]}")
    if problems:
        return Finding("host_ld_cache", FAIL, "; ".join(problems + good), fix)
    return Finding("host_ld_cache", OK, "; ".join(good))


def _image_ld_cache(n: Node, entries: dict[str, list[str]]) -> Finding:
    """The node image's driver: its libraries must resolve, to the loaded driver's version."""
    problems, good = [], []
    for lib in LIBS:
        paths = entries.get(lib, [])
        real = n.host.resolve(paths[0]).resolve() if paths else None
        if not paths:
            problems.append(f"{lib} is not in the host ld cache")
        elif real is None or not real.exists():
            problems.append(f"{lib} => {paths[0]}, which does not exist")
        elif not real.name.endswith(f".so.{n.loaded_version}"):
            problems.append(f"{lib} => {paths[0]} ({real.name}), not the loaded driver "
                            f"{n.loaded_version}")
        else:
            good.append(f"{lib} => {paths[0]}")
    if problems:
        return Finding("host_ld_cache", FAIL, "; ".join(problems + good),
                       "the node image's ld.so.conf.d must name its driver's lib64 (then "
                       "ldconfig); workloads can also set LD_LIBRARY_PATH")
    return Finding("host_ld_cache", OK, "; ".join(good) + " (the node image's driver)")
