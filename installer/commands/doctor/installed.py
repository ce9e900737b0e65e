"""Checks of what install left: status.json, the .cache record, the install dir, the
driver branch, the readiness file."""

from __future__ import annotations

import os
from pathlib import Path

from installer.base import branches
from installer.base.dataclass import dataclass
from installer.base.errors import InstallerError
from installer.commands.doctor.node import (
    FAIL,
    INSTALL_AGAIN,
    INSTALL_FIRST,
    LIBS,
    OK,
    REBOOT_STAGED,
    WARN,
    Finding,
    Node,
    count_files,
)
from installer.records import cache, readiness
from installer.records import staged_driver as nextboot
from installer.records.outcome import ERROR, UNINSTALLED
from installer.records.outcome import OK as OUTCOME_OK


def check_installer_status(n: Node) -> Finding:
    s = n.status
    where = n.install.host_view(n.install.status_file)  # the node's path: what people look at
    if n.status_unreadable is not None:
        return Finding("installer_status", FAIL, f"corrupt status file: {n.status_unreadable}",
                       f"remove {where}; the next install writes a new one")
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
    when = s.finished_at or "?"
    if s.staged:
        kept = nextboot.record(n.install)
        where_kept = (f"kept in {n.install.host_path}/.next-boot" if kept is not None and
                      kept.driver_version == s.staged_driver_version else
                      "but .next-boot no longer holds it: the next run builds it again")
        return Finding("installer_status", WARN,
                       f"last run ok at {when}: driver {s.driver_version} keeps running "
                       f"(in use: {s.in_use_by}); {s.staged_driver_version} is staged for "
                       f"the next boot, {where_kept}",
                       f"{REBOOT_STAGED}: at boot the installer puts in "
                       f"{s.staged_driver_version} with no download or compile (or let it "
                       "wait for the node's next reboot)")
    if s.outcome == OUTCOME_OK:
        return Finding("installer_status", OK, f"last run ok at {when}: driver "
                       f"{s.driver_version} ({s.plan} plan, {s.duration_s}s)")
    if s.outcome == UNINSTALLED:
        return Finding("installer_status", WARN, f"the driver was uninstalled at {when}",
                       INSTALL_AGAIN)
    step_name = (s.context or {}).get("step")
    step = f" in step {step_name}" if step_name else ""
    upgrade = failed_upgrade(n)
    if upgrade is not None:
        return Finding("installer_status", FAIL,
                       f"last run FAILED at {when}{step}: {upgrade.what}. Driver "
                       f"{n.loaded_version} is still loaded, installed intact and working",
                       f"{upgrade.fix} (details: {where})")
    return Finding("installer_status", FAIL,
                   f"last run FAILED at {when}{step}: {s.error_class} (exit "
                   f"{s.exit_code}){_installing(s.driver_version)}: {s.message}",
                   (s.hint or "see the installer's log") + f" (details: {where})")


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
        return Finding("cache", FAIL, f"stale: {stale} ({distro.stale_cache.likely_cause})",
                       f"{n.rerun_install} (restart the installer pod): it "
                       f"{distro.stale_cache.install_does}")
    broken = cache.check_files(r, n.install.root)
    if broken:
        return Finding("cache", FAIL, f"{what}, but {broken}",
                       f"{n.rerun_install} with --force (FORCE_REINSTALL=1) to reinstall")
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
    counts = ", ".join(f"{d}/ {count_files(root / d)} files" for d in ("bin", "lib64", "drivers"))
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
                       f"({counts})", f"{n.rerun_install} with --force (FORCE_REINSTALL=1)")
    if n.node_image_driver:
        ro = ", read-only" if read_only(root) else ""
        return Finding("install_dir", OK, f"{root}: the node image's driver user space "
                       f"({counts}{ro})")
    return Finding("install_dir", OK, f"{n.install.host_path}: {counts}; workloads mount bin/ "
                   "and lib64/ at /usr/local/nvidia")


def read_only(path: Path) -> bool:
    """On a read-only mount (a node image's squashfs): statvfs ST_RDONLY."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


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
                       "release and roll it out (docs/operator/upgrade.md)")
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


def failed_upgrade(n: Node) -> FailedUpgrade | None:
    """The last run failed to replace a driver that is still loaded and installed intact
    (a failed run leaves the previous install byte-identical, docs/contract.md §4)."""
    s, r = n.status, n.record
    loaded = n.loaded_version
    wanted = s.driver_version if s else None
    if not (s and s.outcome == ERROR and wanted and r and loaded == r.driver_version
            and wanted != loaded and cache.check_files(r, n.install.root) is None):
        return None
    why = f"{s.error_class}, exit {s.exit_code}"
    what = f"the upgrade to {wanted} failed ({why}): {s.message}"
    if s.error_class == "download":
        fix = (f"publish the driver {wanted} .run where the node downloads it, or fix "
               f"NVIDIA_DRIVER_VERSION (--driver-version), then {n.rerun_install}")
    else:
        fix = (s.hint or "see the installer_status finding") + f"; then {n.rerun_install}"
    return FailedUpgrade(wanted, why, what, f"{fix} (driver {loaded} keeps working until then)")


def check_readiness(n: Node) -> Finding:
    fields = readiness.read(n.host)
    path = readiness.READY_HOST_PATH
    upgrade = failed_upgrade(n) if fields is None else None
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
                       f"{n.rerun_install} to replace the loaded driver and refresh the file")
    return Finding("readiness", OK, f"{path}: driver {version}, ready at {fields.get('READY_AT')}")
