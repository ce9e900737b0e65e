"""Checks of the node around the driver: its OS, GPUs, signing policy, module loading,
the device plugin, GKE's own installer, disk space."""

from __future__ import annotations

import shutil
import stat
from pathlib import PurePosixPath

from installer import distros
from installer.base.errors import InstallerError
from installer.commands.doctor import coexistence
from installer.commands.doctor.installed import read_only
from installer.commands.doctor.node import FAIL, OK, SWITCH_FROM_GKE, WARN, Finding, Node
from installer.host import gpus
from installer.kmod import signing

DEVICE_PLUGIN_DIR = PurePosixPath("/var/lib/kubelet/device-plugins")

# A fresh install downloads the .run (~400 MB), extracts it (~1 GB) and builds.
FREE_FOR_INSTALL = 2 << 30
FREE_MINIMUM = 256 << 20


def check_host(n: Node) -> Finding:
    if n.host_info is None:
        try:
            distros.detect(n.host, n.kernel_release)
            error = "unknown"
        except InstallerError as exc:
            error = exc.message
        return Finding("host", FAIL, f"cannot tell the host OS: {error}",
                       "check --host-root points at the node's / (ROOT_MOUNT_DIR) and that "
                       "it has /etc/os-release")
    h = n.host_info
    what = f"{h.pretty_name or h.os_id}, kernel {n.kernel_release}"
    if h.build_id:
        what += f", build {h.build_id}"
    return Finding("host", OK, what)


def check_gpus(n: Node) -> Finding:
    if not n.pci:
        return Finding("gpus", FAIL,
                       f"no NVIDIA GPU on the PCI bus ({n.kernel.sys_dir}/bus/pci/devices)",
                       "check a GPU is attached to this VM/node; if one was, it may have fallen "
                       "off the bus (dmesg: Xid 79): reboot or replace the node")
    detail = f"{len(n.pci)} GPU(s): " + "; ".join(g.describe() for g in n.pci)
    # The driver that is loaded, else installed, else the one the last run tried.
    candidates = [n.loaded_version, n.record.driver_version if n.record else None,
                  n.status.driver_version if n.status else None]
    version = next((v for v in candidates if v and v != "unknown"), None)
    problems = gpus.branch_problems(n.pci, version) if version else []
    if problems:
        lo, hi = gpus.allowed_branches(n.pci)
        return Finding("gpus", FAIL, detail + ". " + "; ".join(problems),
                       f"install a driver these GPUs support ({gpus.describe_range(lo, hi)}): "
                       "unset NVIDIA_DRIVER_VERSION to get a supported default, or set one")
    return Finding("gpus", OK, detail)


def check_module_signing(n: Node) -> Finding:
    policy = signing.policy(n.kernel)
    if not policy.enforced:
        return Finding("module_signing", OK, "unsigned modules may load (no lockdown or "
                       "module.sig_enforce" + (", although Secure Boot is on)" if policy.secure_boot
                                               else ")"))
    why = policy.why()
    if n.loaded_version is not None:
        return Finding("module_signing", OK, f"{why}; the loaded NVIDIA modules were accepted "
                       "(they are signed)")
    distro = n.distro
    if distro is not None and distro.signed_modules is not None:
        signed = distro.signed_modules
        return Finding("module_signing", WARN,
                       f"{why}: only signed modules load; {signed.offer}", signed.fix)
    return Finding("module_signing", FAIL,
                   f"{why}: the kernel only loads signed modules and this node's flow builds "
                   "unsigned ones (install exits 10)",
                   "use a node pool without Secure Boot (e.g. --shielded-secure-boot off), or an "
                   "image with signed NVIDIA modules; the installer never edits boot settings")


def check_modules_disabled(n: Node) -> Finding:
    """``kernel.modules_disabled=1`` (set at boot, e.g. by the node image): a fact about what
    this node allows, a failure only when this tool would have to load a module."""
    if not n.kernel.modules_disabled():
        return Finding("modules_disabled", OK, "modules can be loaded (kernel.modules_disabled=0)")
    fact = "kernel.modules_disabled=1: no module can be loaded or unloaded until reboot"
    cached = n.record.driver_version if n.record else None
    if n.loaded_version is None:
        return Finding("modules_disabled", FAIL, f"{fact}, and no NVIDIA driver is loaded: "
                       "install cannot load one (it exits 8)",
                       "use a node image that loads the NVIDIA driver at boot, or one that "
                       "leaves kernel.modules_disabled at 0 until the driver is loaded")
    if cached and cached != n.loaded_version:
        return Finding("modules_disabled", FAIL, f"{fact}: driver {n.loaded_version} is "
                       f"loaded, and the install dir's {cached} can never replace it",
                       f"set the driver version to {n.loaded_version} (--driver-version), or "
                       "use a node image that loads the wanted driver at boot")
    return Finding("modules_disabled", OK, f"{fact}; driver {n.loaded_version} is already "
                   "loaded, so none needs to be")


def check_device_plugin(n: Node) -> Finding:
    plugin_dir = n.host.path(DEVICE_PLUGIN_DIR)
    socks = sorted(plugin_dir.glob("nvidia*.sock")) if plugin_dir.is_dir() else []
    live = [s for s in socks if stat.S_ISSOCK(s.lstat().st_mode)]
    fix = ("check the NVIDIA device plugin DaemonSet (kube-system nvidia-gpu-device-plugin on "
           "GKE): it registers once the driver is ready; pods cannot request nvidia.com/gpu "
           "until then")
    if live:
        return Finding("device_plugin", OK, "registered: " + ", ".join(
            str(DEVICE_PLUGIN_DIR / s.name) for s in live))
    if socks:
        return Finding("device_plugin", WARN, f"{', '.join(s.name for s in socks)} in "
                       f"{DEVICE_PLUGIN_DIR} but not a socket (stale)", fix)
    return Finding("device_plugin", WARN, f"no nvidia*.sock in {DEVICE_PLUGIN_DIR}", fix)


def check_gke_installer(n: Node) -> Finding:
    """GKE's own installer on this node: its DaemonSet's pod, or a .cache it wrote."""
    pods = coexistence.gke_pods(n.host.resolve(coexistence.POD_LOGS_DIR))
    theirs = [p.host_dir for p in pods if p.runs_ours is not True]
    if theirs:
        return Finding("gke_installer", WARN, "GKE's nvidia-driver-installer DaemonSet has a "
                       f"pod on this node ({', '.join(theirs)}): two installers take turns on "
                       "one driver, kept apart only by the host lock", SWITCH_FROM_GKE)
    if n.record is not None and coexistence.cache_written_by_gke(n.record.fields):
        return Finding("gke_installer", OK, "the install dir's .cache was written by GKE's "
                       "installer; this one takes it over as it is (no GKE installer pod here)")
    return Finding("gke_installer", OK, f"no pod of GKE's installer DaemonSet in "
                   f"{coexistence.POD_LOGS_DIR}")


def check_disk(n: Node) -> Finding:
    path = n.install.root
    while not path.exists() and path != path.parent:
        path = path.parent
    if read_only(path):
        # A squashfs (a node image's driver) has no free block, and never will: that is
        # no disk to free, only a dir install cannot write.
        if n.node_image_driver:
            return Finding("disk_space", OK, f"{path} is read-only (the node image's): "
                           "nothing is written there")
        return Finding("disk_space", FAIL, f"{path} is on a read-only filesystem: install "
                       "cannot write the driver there",
                       "point --install-dir-host (NVIDIA_INSTALL_DIR_HOST) at a writable dir "
                       "on the node, e.g. /home/kubernetes/bin/nvidia")
    free = shutil.disk_usage(path).free
    mib = free >> 20
    if free < FREE_MINIMUM:
        return Finding("disk_space", FAIL, f"{mib} MiB free in {path}",
                       "free disk space on the node (the install exits 11 when it runs out)")
    if free < FREE_FOR_INSTALL:
        return Finding("disk_space", WARN, f"{mib} MiB free in {path}: enough to load the cached "
                       f"driver, not for a new install (needs ~{FREE_FOR_INSTALL >> 20} MiB)",
                       "free disk space before changing the driver version or kernel")
    return Finding("disk_space", OK, f"{mib} MiB free in {path}")
