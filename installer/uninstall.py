"""``uninstall``: unload the driver and remove the install, keeping logs and status.

Idempotent: each part checks before it acts, so a second run finds nothing to
do and exits 0. If the loaded driver is in use it stops before changing
anything (exit 8, naming the holders), exactly as a replace would.
"""

from __future__ import annotations

import os
import time
from pathlib import PurePosixPath

import structlog

from installer import devchar, ldcache, modules, readiness, status
from installer.context import Context
from installer.errors import ModuleLoadError, UsageError, VerifyError
from installer.hostroot import HostRoot
from installer.installdir import LAYOUT_DIRS, InstallDir
from installer.lock import HostLock
from installer.runner import CommandError
from installer.settings import Settings

log = structlog.get_logger(__name__)


def remove_host_ld_entry(host: HostRoot, lib_dir_host: PurePosixPath) -> list[str]:
    """Drop our ld.so.conf line(s) and our drop-in; returns the host paths changed."""
    changed = []
    entry = str(lib_dir_host)
    text = host.read_text(ldcache.LD_SO_CONF)
    if text is not None:
        kept = [ln for ln in text.splitlines() if ln.strip() != entry]
        if len(kept) != len(text.splitlines()):
            host.write_atomic(ldcache.LD_SO_CONF, "\n".join(kept) + ("\n" if kept else ""))
            changed.append(str(ldcache.LD_SO_CONF))
    drop_in = host.read_text(ldcache.HOST_DROP_IN)
    if drop_in is not None and drop_in.strip() == entry:
        host.unlink(ldcache.HOST_DROP_IN)  # only ours: another package's nvidia.conf stays
        changed.append(str(ldcache.HOST_DROP_IN))
    return changed


def remove_device_nodes(dev_dir) -> list[str]:
    """NVIDIA device nodes are stale once the modules are gone."""
    removed = []
    for dev in devchar.nvidia_char_devices(dev_dir):
        (dev_dir / dev.rel).unlink(missing_ok=True)
        removed.append(dev.rel)
    caps = dev_dir / devchar.CAPS_DIR
    if caps.is_dir() and not any(caps.iterdir()):
        caps.rmdir()
    return removed


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


def run(settings: Settings) -> dict[str, object]:
    assert settings.install_dir is not None, "settings must be resolved"
    started = time.monotonic()
    ctx = Context.from_settings(settings, strict=False)  # the OS does not matter here
    host, kernel, runner, install = ctx.host, ctx.kernel, ctx.runner, ctx.install
    done: dict[str, object] = {}
    with HostLock(host, settings.lock_timeout_s):
        ours = _is_ours(install)
        # In use: refuse before touching anything (ModuleLoadError, exit 8, names holders).
        loaded = modules.loaded_driver_version(kernel)
        busy = modules.users(kernel) if loaded is not None else {}
        if busy:
            holders = "; ".join(f"{m}: {', '.join(h)}" for m, h in busy.items())
            raise ModuleLoadError(
                f"NVIDIA driver {loaded} is loaded and in use ({holders}); not uninstalling",
                hint="drain GPU workloads from this node (kubectl drain <node> "
                "--ignore-daemonsets) and re-run; nothing was changed",
            )
        done["readiness_removed"] = readiness.clear(host)
        done["modules_unloaded"] = modules.unload(kernel, runner) if loaded else []
        done["dev_char_links_removed"] = devchar.remove(kernel.dev_dir)
        done["device_nodes_removed"] = remove_device_nodes(kernel.dev_dir)
        present = [d for d in LAYOUT_DIRS if (install.root / d).exists()]
        had_cache = install.cache_file.exists()
        if install.root.is_dir():
            install.remove_install()
        done["install_dir_removed"] = present + ([".cache"] if had_cache else [])
        changed = remove_host_ld_entry(host, install.lib64_host())
        done["ld_conf_changed"] = changed
        if changed or done["install_dir_removed"]:
            try:
                runner.run(["ldconfig", "-r", str(host.root)], timeout=ldcache.LDCONFIG_TIMEOUT_S)
            except CommandError as exc:
                raise VerifyError(f"ldconfig failed refreshing the host ld cache: "
                                  f"{exc.stderr_tail(3)}",
                                  hint="run ldconfig on the node by hand") from exc
        nothing = not any(done.values())
        doc = {"outcome": "uninstalled", "exit_code": 0, "previous_driver_version": loaded,
               "install_dir_host": str(install.host_path), "changes": done,
               "duration_s": round(time.monotonic() - started, 3)}
        if ours or done["install_dir_removed"]:
            status.write(install.status_file, **doc)
    log.info("uninstall_finished", **done, previous_driver_version=loaded,
             message="nothing to remove: no NVIDIA driver was installed or loaded" if nothing
             else f"NVIDIA driver {loaded or ''} unloaded and removed; logs and status.json "
             f"kept in {install.host_path}".replace("driver  ", "driver "))
    return doc
