"""``doctor``: check a node's GPU driver set-up and say what to fix.

Read-only: no lock, nothing written. Each check gives a verdict (ok, warn,
fail), a one-line detail with the facts, and for warn/fail the fix. A check
that crashes becomes a failed finding, so one odd file never hides the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import textwrap
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePosixPath

from installer import (
    branches,
    cache,
    devchar,
    devnodes,
    distros,
    firmware,
    gpus,
    ldcache,
    modules,
    nextboot,
    readiness,
    signing,
)
from installer import status as status_file
from installer.context import Context
from installer.detect import context
from installer.distros.base import Distro
from installer.errors import ExitCode, InstallerError
from installer.fsutil import UnreadableFile
from installer.gpus import Gpu
from installer.osinfo import HostInfo
from installer.runner import CommandError
from installer.settings import Settings
from installer.verify import check_driver_version, nvidia_smi
from installer.workstate import InUse

OK, WARN, FAIL = "ok", "warn", "fail"
LIBS = ("libcuda.so.1", "libnvidia-ml.so.1")
DEVICE_PLUGIN_DIR = PurePosixPath("/var/lib/kubelet/device-plugins")
# A fresh install downloads the .run (~400 MB), extracts it (~1 GB) and builds.
FREE_FOR_INSTALL = 2 << 30
FREE_MINIMUM = 256 << 20
# What to do on a node install has never run on (no status, no record, no driver files).
INSTALL_FIRST = ("install the driver: apply the installer DaemonSet (README, \"Get the images\" "
                 "and \"One DaemonSet per pool\"), or on the node itself: sudo "
                 "nvidia-driver-installer install --host-root /")
SWITCH_FROM_GKE = ("keep one installer: delete GKE's DaemonSet (kubectl -n kube-system delete "
                   "daemonset nvidia-driver-installer), and create GPU node pools with "
                   "gpu-driver-version=disabled (README, \"Switching from GKE's installer\")")
DRAIN = ("drain GPU workloads from the node (kubectl drain <node> --ignore-daemonsets "
         "--delete-emptydir-data), then re-run install")
# The README's runbook for a staged version: nothing to re-run, the reboot installs it.
REBOOT_STAGED = ("drain the node (kubectl drain <node> --ignore-daemonsets "
                 "--delete-emptydir-data), reboot it, then kubectl uncordon <node>")
INSTALL_AGAIN = "run install to install it again"


@dataclass(frozen=True)
class Finding:
    check: str
    verdict: str  # ok | warn | fail
    detail: str
    fix: str = ""


@dataclass
class Node:
    """The run's context plus what the checks read once (status, cache record, GPUs)."""

    ctx: Context
    status: dict | None = None
    record: cache.CacheRecord | None = None
    pci: list[gpus.PciGpu] = field(default_factory=list)
    _smi: list[Gpu] | InstallerError | None = None

    def __getattr__(self, name: str):  # host, kernel, install, runner, settings: the context's
        return getattr(self.ctx, name)

    @property
    def host_info(self) -> HostInfo | None:
        return self.ctx.host_info if self.ctx.host_info.known else None

    @property
    def distro(self) -> type[Distro] | None:
        return distros.by_name(self.host_info.family) if self.host_info is not None else None

    @property
    def kernel_release(self) -> str:
        return self.ctx.host_info.kernel_release

    @property
    def loaded_version(self) -> str | None:
        return modules.loaded_driver_version(self.kernel)

    @property
    def node_image_driver(self) -> bool:
        """A driver is loaded that this tool never installed here (no status.json, no .cache
        record): the node image's, e.g. GKE's on a read-only /usr/local/nvidia (a real H100
        node: tests/data/gpu-node). Its files are not ours to judge as an install."""
        return self.loaded_version is not None and self.status is None and self.record is None

    def smi(self) -> list[Gpu] | InstallerError:
        """nvidia-smi's GPUs, or why it failed; run once per doctor."""
        if self._smi is None:
            try:
                self._smi = nvidia_smi(self.install, self.kernel, self.runner,
                                       lib_dir=self.install.lib64)
            except InstallerError as exc:
                self._smi = exc
        return self._smi

    def image_driver(self) -> str:
        """'driver V loaded by the node image; not installed by this tool; nvidia-smi ...'"""
        smi = self.smi()
        works = ("nvidia-smi works" if not isinstance(smi, InstallerError)
                 else f"nvidia-smi fails ({smi.message})")
        return (f"driver {self.loaded_version} loaded by the node image; not installed by "
                f"this tool; {works}")

    @property
    def uninstalled(self) -> str | None:
        """When `uninstall` removed the install (its status.json says so), else None."""
        s = self.status or {}
        if s.get("outcome") == "uninstalled" and self.record is None:
            return str(s.get("finished_at", "?"))
        return None

    @property
    def never_installed(self) -> bool:
        """No status.json, no .cache record and no driver file: install has never run here
        (so "re-run" and "--force" advice would mislead)."""
        return (self.status is None and self.record is None and self.loaded_version is None
                and not any(_count(self.install.root / d) for d in ("bin", "lib64", "drivers")))


def _load(settings: Settings) -> Node:
    node = Node(context(settings, strict=False))
    try:
        node.status = status_file.read(node.install.status_file)
    except UnreadableFile as exc:  # reported by check_installer_status, never a hang
        node.status = {"outcome": "unreadable", "message": f"status.json {exc.reason}"}
    node.record = cache.read(node.install.cache_file)
    node.pci = gpus.scan(node.kernel.sys_dir)
    return node


# -- the checks, in the order a person would look ---------------------------


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
                  (n.status or {}).get("driver_version")]
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
        offer, fix = distro.signed_modules
        return Finding("module_signing", WARN, f"{why}: only signed modules load; {offer}", fix)
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


def check_installer_status(n: Node) -> Finding:
    s = n.status
    where = n.install.host_view(n.install.status_file)  # the node's path: what people look at
    if s is None and n.never_installed:
        return Finding("installer_status", WARN, "install has never run on this node: no "
                       f"status.json, .cache or driver files in {n.install.host_path}",
                       INSTALL_FIRST)
    if s is None and n.node_image_driver:
        smi_ok = not isinstance(n.smi(), InstallerError)
        return Finding("installer_status", OK if smi_ok else WARN, n.image_driver(),
                       "" if smi_ok else "see the nvidia_smi finding")
    if s is None:
        return Finding("installer_status", WARN, f"no status.json in {n.install.host_path}: "
                       "the installer has not run with this install dir",
                       "run install, or check --install-dir / NVIDIA_INSTALL_DIR_CONTAINER "
                       "points at the host's install dir")
    if s.get("outcome") == "unreadable":
        return Finding("installer_status", FAIL, f"corrupt status file: {s['message']}",
                       f"remove {where}; the next install writes a new one")
    when = s.get("finished_at", "?")
    staged = _staged(s)
    if staged is not None:
        kept = nextboot.record(n.install)
        where_kept = (f"kept in {n.install.host_path}/.next-boot" if kept is not None and
                      kept.driver_version == s.get("driver_version") else
                      "but .next-boot no longer holds it: the next run builds it again")
        return Finding("installer_status", WARN,
                       f"last run ok at {when}: driver {staged.running_version} keeps running "
                       f"(in use: {staged.holders}); {s.get('driver_version')} is staged for "
                       f"the next boot, {where_kept}",
                       f"{REBOOT_STAGED}: at boot the installer puts in "
                       f"{s.get('driver_version')} with no download or compile (or let it "
                       "wait for the node's next reboot)")
    if s.get("outcome") == "ok":
        return Finding("installer_status", OK, f"last run ok at {when}: driver "
                       f"{s.get('driver_version')} ({s.get('plan')} plan, {s.get('duration_s')}s)")
    if s.get("outcome") == "uninstalled":
        return Finding("installer_status", WARN, f"the driver was uninstalled at {when}",
                       INSTALL_AGAIN)
    ctx = s.get("context") or {}
    step = f" in step {ctx['step']}" if ctx.get("step") else ""
    upgrade = _failed_upgrade(n)
    if upgrade is not None:
        return Finding("installer_status", FAIL,
                       f"last run FAILED at {when}{step}: {upgrade.what}. Driver "
                       f"{n.loaded_version} is still loaded, installed intact and working",
                       f"{upgrade.fix} (details: {where})")
    return Finding("installer_status", FAIL,
                   f"last run FAILED at {when}{step}: {s.get('error_class')} (exit "
                   f"{s.get('exit_code')}){_installing(s.get('driver_version'))}: "
                   f"{s.get('message')}",
                   (s.get("hint") or "see the installer's log") + f" (details: {where})")


def _installing(version: str | None) -> str:
    """" installing driver V", or nothing when the run failed before it chose a version."""
    return f" installing driver {version}" if version and version != "unknown" else ""


def check_cache(n: Node) -> Finding:
    r = n.record
    if r is None and n.never_installed:
        return Finding("cache", FAIL, "no .cache record: install has never run on this node",
                       INSTALL_FIRST)
    if r is None and n.uninstalled:
        return Finding("cache", FAIL, f"no .cache record: the driver was uninstalled at "
                       f"{n.uninstalled}", INSTALL_AGAIN)
    if r is None and n.node_image_driver:
        return Finding("cache", OK, f"no .cache record in {n.install.root}: this tool has not "
                       "installed a driver here (the loaded one is the node image's)")
    if r is None:
        return Finding("cache", FAIL, f"no .cache record in {n.install.root}: no complete, "
                       "verified install here",
                       "run install (a killed or failed run leaves no record on purpose)")
    target = (f"build {r.build_id}" if r.build_id else f"kernel {r.kernel_release}")
    what = f"driver {r.driver_version} for {target} ({r.describe_modules()})"
    # The record's driver, keyed as this node's distro keys installs (COS: its build,
    # else the kernel); an unknown host's is not judged (check_host says why).
    distro, info = n.distro, n.host_info
    stale = (r.mismatch(distro.node_key(info, r.driver_version or ""))
             if distro and info else None)
    if distro and stale:
        why, does = distro.stale_cache
        return Finding("cache", FAIL, f"stale: {stale} ({why})",
                       f"re-run install (restart the installer pod): it {does}")
    broken = cache.check_files(r, n.install.root)
    if broken:
        return Finding("cache", FAIL, f"{what}, but {broken}",
                       "re-run install with --force (FORCE_REINSTALL=1) to reinstall")
    return Finding("cache", OK, what)


def check_install_dir(n: Node) -> Finding:
    root = n.install.root
    if not root.is_dir():
        return Finding("install_dir", FAIL, f"{root} does not exist "
                       f"(host: {n.install.host_path})", "run install")
    missing = []
    # nvidia-modprobe is ours to install; a node image's driver may come without it.
    programs = ("bin/nvidia-smi",) if n.node_image_driver else ("bin/nvidia-smi",
                                                                   "bin/nvidia-modprobe")
    for rel in programs:
        p = root / rel
        if not (p.is_file() and os.access(p, os.X_OK)):
            missing.append(rel)
    for lib in LIBS:
        if not (root / "lib64" / lib).exists():  # follows the SONAME link
            missing.append(f"lib64/{lib}")
    counts = ", ".join(f"{d}/ {_count(root / d)} files" for d in ("bin", "lib64", "drivers"))
    if missing and n.never_installed:
        return Finding("install_dir", FAIL, f"{n.install.host_path} is empty: install has never "
                       "run on this node", INSTALL_FIRST)
    if missing and n.uninstalled:
        return Finding("install_dir", FAIL, f"{n.install.host_path} holds no driver: it was "
                       f"uninstalled at {n.uninstalled}", INSTALL_AGAIN)
    if missing and n.node_image_driver:
        return Finding("install_dir", FAIL, f"{root} holds no usable user space of the loaded "
                       f"driver {n.loaded_version}: missing {', '.join(missing)} ({counts})",
                       "point --install-dir (NVIDIA_INSTALL_DIR_CONTAINER) at the node image's "
                       "driver directory (GKE: /usr/local/nvidia)")
    if missing:
        return Finding("install_dir", FAIL, f"missing or broken: {', '.join(missing)} "
                       f"({counts})", "re-run install with --force (FORCE_REINSTALL=1)")
    if n.node_image_driver:
        ro = ", read-only" if _read_only(root) else ""
        return Finding("install_dir", OK, f"{root}: the node image's driver user space "
                       f"({counts}{ro})")
    return Finding("install_dir", OK, f"{n.install.host_path}: {counts}; workloads mount bin/ "
                   "and lib64/ at /usr/local/nvidia")


def _read_only(path: Path) -> bool:
    """On a read-only mount (a node image's squashfs): statvfs ST_RDONLY."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _count(d: Path) -> int:
    try:
        return sum(1 for _ in d.iterdir())
    except OSError:
        return 0


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
    staged = _staged(n.status or {})
    # With a version staged for the next boot, the running one is what the last run kept.
    wanted = staged.running_version if staged else (n.status or {}).get("driver_version")
    upgrade = _failed_upgrade(n)
    if upgrade is not None:  # the old driver is whole: no library/module mismatch
        fix = DRAIN if busy else upgrade.fix
        return Finding("kernel_modules", WARN, f"{detail}, the one the install dir holds: it "
                       f"works; {upgrade.what}; {use}", fix)
    for other, label in ((cached, "the install dir holds"), (wanted, "the last run wanted")):
        if other and version != other:
            fix = ("reboot the node: this kernel cannot unload the running driver" if stuck
                   else DRAIN if busy else "re-run install: the old driver is unused, so it is "
                   "unloaded and replaced")
            return Finding("kernel_modules", FAIL, f"{detail}, but {label} {other} (libraries "
                           f"and kernel module differ: NVML 'Driver/library version mismatch'); "
                           f"{use}", fix)
    if "nvidia_uvm" not in ours:
        return Finding("kernel_modules", FAIL, f"{detail}; nvidia_uvm is not loaded: CUDA "
                       "cannot start", "re-run install (it loads nvidia-uvm)")
    return Finding("kernel_modules", OK, f"{detail}; {use}")


def _staged(status: dict) -> InUse | None:
    """The driver kept running when the last run staged a version for the next boot."""
    staged = status.get("staged_for_next_boot") if status.get("outcome") == "ok" else None
    if not isinstance(staged, dict):
        return None
    return InUse(str(staged.get("running_version", "?")), str(staged.get("holders", "?")))


def check_driver_branch(n: Node) -> Finding:
    """The running (else installed) driver's branch against the dated policy table."""
    version = n.loaded_version or (n.record.driver_version if n.record else None)
    policy = branches.describe()
    if version is None or version == "unknown":
        return Finding("driver_branch", OK, f"no driver to check; {policy}")
    ended = branches.branch_warning(version)
    if ended:
        return Finding("driver_branch", WARN, f"{ended} ({policy})",
                       "set NVIDIA_DRIVER_VERSION (--driver-version) to a supported branch's "
                       "release and roll it out (README: Upgrading the driver on busy nodes)")
    known = branches.branch(version)
    what = (f"R{known.number}, {known.kind} branch, supported until {known.until}" if known
            else "a branch the policy table does not list")
    return Finding("driver_branch", OK, f"driver {version}: {what}; {policy}")


@dataclass(frozen=True)
class FailedUpgrade:
    wanted: str
    why: str  # "<class>, exit N"
    what: str  # "the upgrade to V failed (<class>, exit N): <error>"
    fix: str


def _failed_upgrade(n: Node) -> FailedUpgrade | None:
    """The last run failed to replace a driver that is still loaded and installed intact
    (a failed run leaves the previous install byte-identical, DESIGN §4)."""
    s, r = n.status or {}, n.record
    loaded, wanted = n.loaded_version, s.get("driver_version")
    if not (s.get("outcome") == "error" and wanted and r and loaded == r.driver_version
            and wanted != loaded and cache.check_files(r, n.install.root) is None):
        return None
    why = f"{s.get('error_class')}, exit {s.get('exit_code')}"
    what = f"the upgrade to {wanted} failed ({why}): {s.get('message')}"
    if s.get("error_class") == "download":
        fix = (f"publish the driver {wanted} .run where the node downloads it, or fix "
               "NVIDIA_DRIVER_VERSION (--driver-version), then re-run install")
    else:
        fix = (s.get("hint") or "see the installer_status finding") + "; then re-run install"
    return FailedUpgrade(wanted, why, what, f"{fix} (driver {loaded} keeps working until then)")


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
                   "re-run install (it sets firmware_class.path to <install-dir-host>/firmware, "
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
                       "re-run install" + (f", or on the node: {by_hand}" if by_hand else ""))
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
                       "re-run install (it creates them), or: nvidia-ctk system "
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
    fix = (f"re-run install: it puts {lib_dir} in /etc/ld.so.conf.d/nvidia.conf and runs "
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


def check_readiness(n: Node) -> Finding:
    fields = readiness.read(n.host)
    path = readiness.READY_HOST_PATH
    upgrade = _failed_upgrade(n) if fields is None else None
    if upgrade is not None:  # README, "Readiness after a failed run": only what it found
        return Finding("readiness", WARN, f"{path} is absent, and the upgrade to "
                       f"{upgrade.wanted} failed ({upgrade.why}): a failed run puts back only a "
                       f"file it found (none, or it could not); driver {n.loaded_version} works, "
                       "but components waiting for the file (device plugin, toolkit) stay blocked",
                       "fix the upgrade (installer_status): the file is written again once a "
                       "run verifies the driver")
    if fields is None and n.node_image_driver:
        return Finding("readiness", OK, f"{path} is absent: install writes it after verifying "
                       "a driver it installed, and the loaded one is the node image's")
    if fields is None:
        return Finding("readiness", WARN, f"{path} is absent: components waiting for it (device "
                       "plugin, toolkit) stay blocked",
                       "run install: it writes the file only after the driver is verified")
    version = fields.get("NVIDIA_DRIVER_VERSION")
    loaded = n.loaded_version
    if loaded and version and loaded != version:
        return Finding("readiness", WARN, f"{path} says driver {version} but {loaded} is loaded",
                       "re-run install to replace the loaded driver and refresh the file")
    return Finding("readiness", OK, f"{path}: driver {version}, ready at {fields.get('READY_AT')}")


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
    from installer.gke import coexistence

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
    if _read_only(path):
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


CHECKS: tuple[tuple[str, Callable[[Node], Finding]], ...] = (
    ("host", check_host),
    ("gpus", check_gpus),
    ("module_signing", check_module_signing),
    ("modules_disabled", check_modules_disabled),
    ("installer_status", check_installer_status),
    ("cache", check_cache),
    ("install_dir", check_install_dir),
    ("kernel_modules", check_kernel_modules),
    ("driver_branch", check_driver_branch),
    ("gpu_firmware", check_gpu_firmware),
    ("device_nodes", check_device_nodes),
    ("dev_char_symlinks", check_dev_char),
    ("nvidia_smi", check_nvidia_smi),
    ("host_ld_cache", check_host_ld_cache),
    ("readiness", check_readiness),
    ("device_plugin", check_device_plugin),
    ("gke_installer", check_gke_installer),
    ("disk_space", check_disk),
)


@dataclass
class Report:
    node: dict[str, object]
    findings: list[Finding]

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == FAIL]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == WARN]

    @property
    def healthy(self) -> bool:
        return not self.failed

    @property
    def exit_code(self) -> int:
        # A failed check means the installed driver is not verified working: the verify
        # class (9), as for `verify`. The other codes name why an install run stopped;
        # doctor runs nothing, and the finding names the cause.
        return 0 if self.healthy else int(ExitCode.VERIFY)

    def to_dict(self) -> dict[str, object]:
        return {"healthy": self.healthy, "node": self.node,
                "summary": self.summary(),
                "findings": [asdict(f) for f in self.findings]}

    def summary(self) -> str:
        if self.healthy:
            extra = f" ({len(self.warnings)} warning(s))" if self.warnings else ""
            return f"HEALTHY: the NVIDIA driver is installed, loaded and verified{extra}"
        first = self.failed[0]
        return (f"UNHEALTHY: {len(self.failed)} check(s) failed "
                f"({', '.join(f.check for f in self.failed)}). Start with {first.check}: "
                f"{first.fix or first.detail}")


def run(settings: Settings) -> Report:
    node = _load(settings)
    findings = []
    for name, check in CHECKS:
        try:
            findings.append(check(node))
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
            findings.append(Finding(name, FAIL, f"the check itself failed: "
                                    f"{type(exc).__name__}: {exc}",
                                    "report this as an installer bug; check by hand meanwhile"))
    if node.never_installed or node.uninstalled:  # nothing to re-run yet
        findings = [replace(f, fix=f.fix.replace("re-run install", "run install"))
                    for f in findings]
    info = node.host_info
    return Report(
        node={
            "os": info.os_id if info else None,
            "kernel_release": node.kernel_release,
            "build_id": info.build_id if info else None,
            "install_dir": str(node.install.root),
            "install_dir_host": str(node.install.host_path),
            "gpus": [g.to_dict() for g in node.pci],
            "loaded_driver_version": node.loaded_version,
        },
        findings=findings,
    )


def render_text(report: Report, width: int | None = None) -> str:
    """The table: one row per check, the fix under each warn/fail row."""
    width = width or max(80, min(shutil.get_terminal_size((120, 24)).columns, 140))
    name_w = max(len(f.check) for f in report.findings)
    verdict_w = 4
    indent = 2 + verdict_w + 2 + name_w + 2
    body_w = max(30, width - indent)
    n = report.node
    lines = [*_wrap(f"nvidia-driver-installer doctor: {n['os'] or 'unknown OS'}, kernel "
                    f"{n['kernel_release']}, install dir {n['install_dir_host']}", width), ""]
    lines.append(f"  {'':{verdict_w}}  {'CHECK':{name_w}}  DETAIL")
    for f in report.findings:
        label = {OK: "ok", WARN: "WARN", FAIL: "FAIL"}[f.verdict]
        detail = _wrap(f.detail, body_w)
        lines.append(f"  {label:{verdict_w}}  {f.check:{name_w}}  {detail[0]}")
        lines += [" " * indent + d for d in detail[1:]]
        if f.verdict != OK and f.fix:
            fix = _wrap("fix: " + f.fix, body_w)
            lines += [" " * indent + d for d in fix]
    lines += ["", *_wrap(report.summary(), width)]
    return "\n".join(lines) + "\n"


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False) or [""]


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2) + "\n"
