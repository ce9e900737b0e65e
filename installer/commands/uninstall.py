"""``uninstall``: unload the driver and remove the install, keeping logs and status.

Idempotent: each part checks before it acts, so a second run finds nothing to
do and exits 0. If the loaded driver is in use it stops before changing
anything (exit 8, naming the holders), exactly as a replace would.
"""

from __future__ import annotations

import os
import time

import structlog

from installer.base.errors import UsageError
from installer.detect import context
from installer.host.hostroot import HostRoot
from installer.host.installdir import LAYOUT_DIRS, InstallDir
from installer.host.lock import HostLock
from installer.kmod import devchar, firmware, ldcache, modules
from installer.kmod.kernel import KernelState
from installer.records import readiness, status
from installer.records.outcome import DRY_RUN, UNINSTALLED, Outcome
from installer.settings import Settings

log = structlog.get_logger(__name__)


def _is_ours(install: InstallDir) -> bool:
    """Whether the install dir is one an installer made: our (or GKE's) ``.cache`` or our
    ``status.json`` is in it. Layout dirs without either are refused (exit 2): the
    options point somewhere else (``--install-dir-host /`` would name the host's own
    ``/bin`` and ``/lib64``)."""
    ours = any(p.is_file() and not p.is_symlink()
               for p in (install.cache_file, install.status_file))
    present = [d for d in LAYOUT_DIRS if os.path.lexists(install.root / d)]
    if present and not ours:
        raise UsageError(
            f"{install.root} (host {install.host_path}) is not an NVIDIA install dir: it has "
            f"{', '.join(d + '/' for d in present)} but no .cache or status.json; not removing "
            "anything",
            hint="check --install-dir-host / --install-dir (NVIDIA_INSTALL_DIR_HOST / "
            "NVIDIA_INSTALL_DIR_CONTAINER) name the driver's install dir",
            path=str(install.host_path),
        )
    return ours


def _refuse_in_use(kernel: KernelState) -> str | None:
    """The loaded driver's version; exit 8 if it is in use or stuck (before any change)."""
    loaded = modules.loaded_driver_version(kernel)
    if loaded is not None:
        modules.ensure_unloadable(kernel, "not uninstalling")
        modules.ensure_unused(kernel, "not uninstalling")
    return loaded


def _readiness_file_present(host: HostRoot) -> bool:
    """What readiness.clear would unlink: anything but a directory at the readiness path."""
    ready = readiness.READY_HOST_PATH
    path = host.resolve(ready.parent) / ready.name
    return os.path.lexists(path) and not path.is_dir()


def dry_run(settings: Settings) -> Outcome:
    """``uninstall --dry-run``: what the real run would remove, each part as its real run
    names it in ``changes``, and the same refusals (exit 2 for a dir that is not ours, 8
    for a driver in use); nothing is locked, written, unloaded or removed."""
    ctx = context(settings, strict=False)
    host, kernel, install = ctx.host, ctx.kernel, ctx.install
    ours = _is_ours(install)
    loaded = _refuse_in_use(kernel)
    present = [d for d in LAYOUT_DIRS if (install.root / d).exists()]
    would = {
        "readiness_removed": _readiness_file_present(host),
        "modules_unloaded": [n for n in modules.NVIDIA_MODULES if n in kernel.modules()],
        "dev_char_links_removed": [link.name for link in devchar.nvidia_links(kernel.dev_dir)],
        "device_nodes_removed": [dev.rel for dev in devchar.nvidia_char_devices(kernel.dev_dir)],
        "firmware_copies_removed": [str(p) for p in firmware.our_copies(host, install)]
        if ours else [],
        "install_dir_removed": present + ([".cache"] if install.cache_file.exists() else []),
        "ld_conf_changed": ldcache.our_host_files(host, install.lib64_host()),
    }
    log.info("uninstall_dry_run", **would, previous_driver_version=loaded,
             message="nothing changed: the lists say what uninstall would remove")
    return Outcome(DRY_RUN, previous_driver_version=loaded,
                   install_dir_host=str(install.host_path),
                   dry_run={"dry_run": True, "would_change": would})


def run(settings: Settings) -> Outcome:
    if settings.dry_run:
        return dry_run(settings)
    started = time.monotonic()
    ctx = context(settings, strict=False)  # the OS does not matter here
    host, kernel, runner, install = ctx.host, ctx.kernel, ctx.runner, ctx.install
    done: dict[str, object] = {}
    if install.root.is_dir():
        install.check_writable()  # all or nothing: never unload, then fail to remove
    with HostLock(host, settings.lock_timeout_s):
        ours = _is_ours(install)
        loaded = _refuse_in_use(kernel)  # in use or stuck: before touching anything (exit 8)
        done["readiness_removed"] = readiness.clear(host)
        done["modules_unloaded"] = modules.unload(kernel, runner) if loaded else []
        done["dev_char_links_removed"] = devchar.remove(kernel.dev_dir)
        done["device_nodes_removed"] = devchar.remove_nodes(kernel.dev_dir)
        # Before the install goes: its firmware tells our copies from anyone else's.
        done["firmware_copies_removed"] = firmware.remove_copies(host, install) if ours else []
        present = [d for d in LAYOUT_DIRS if (install.root / d).exists()]
        had_cache = install.cache_file.exists()
        if install.root.is_dir():
            install.remove_install()
        done["install_dir_removed"] = present + ([".cache"] if had_cache else [])
        done["ld_conf_changed"] = ldcache.remove_host(
            host, runner, install.lib64_host(), refresh=bool(done["install_dir_removed"]))
        nothing = not any(done.values())
        outcome = Outcome(UNINSTALLED, previous_driver_version=loaded,
                          install_dir_host=str(install.host_path), changes=done,
                          duration_s=round(time.monotonic() - started, 3))
        if ours or done["install_dir_removed"]:
            status.write(install.status_file, outcome)
    driver = f"NVIDIA driver {loaded}" if loaded else "NVIDIA driver"
    log.info("uninstall_finished", **done, previous_driver_version=loaded,
             message="nothing to remove: no NVIDIA driver was installed or loaded" if nothing
             else f"{driver} unloaded and removed; logs and status.json kept in "
             f"{install.host_path}")
    return outcome
