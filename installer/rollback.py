"""Put the node back as it was after a failed or interrupted run (docs/contract.md §4).

The steps that change the node note each change in the run's journal
(records/journal.py) as they make it; when a run fails at any later point, even
half way through a step, ``undo`` reverses what the journal holds, newest first: the modules this run
loaded are unloaded, a promoted install swaps back for the one it replaced,
``firmware_class.path`` gets its old value, and the driver this run unloaded
is loaded again from the install dir, with the module parameters it had, and its
device files. Device files this run made for a driver that is gone again are
removed. Then the readiness file the run cleared comes back, byte for byte
("readiness as before"), when all of that worked and the driver it names is the
one loaded, unless this run found that very driver not working (README,
"Readiness after a failed run").

Every action is best effort: the run's own error is what gets reported; what
could not be undone is logged (``roll_back_incomplete``) for the operator.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from installer.base.errors import InstallerError
from installer.kmod import devnodes, firmware, ldcache, modules
from installer.kmod.moduleargs import ModuleArg
from installer.records import cache, readiness
from installer.records.journal import Journal, device_files

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)

# Steps whose failure says the loaded driver does not work, when the run never touched it.
DRIVER_CHECKS = ("device_nodes", "verify_staged", "verify")


def undo(ctx: Context, error: BaseException) -> None:
    """Reverse what ``ctx.journal`` records after ``error`` (see the module docstring)."""
    changes: Journal = ctx.journal
    if changes.committed:  # e.g. the readiness file could not be written: the new driver stays
        return
    done = []
    if changes.loaded:
        done.append(_attempt("unload_new_modules",
                             lambda: modules.unload(ctx.kernel, ctx.runner, only=changes.loaded)))
    if changes.promoted:
        done.append(_attempt("restore_previous_install", ctx.install.restore_previous))
    if (firmware_path := changes.firmware_path_before) is not None:
        done.append(_attempt("restore_firmware_path", lambda: firmware.set_search_path(
            ctx.kernel, firmware_path)))
    unloaded = changes.unloaded_version
    reloaded = bool(unloaded) and _attempt(
        "reload_previous_driver", lambda: _reload_previous(ctx, unloaded or ""))
    if changes.unloaded_version:
        done.append(reloaded)
    if reloaded:
        done.append(_attempt("previous_device_files", lambda: _make_device_files(ctx)))
    elif (device_files := changes.device_files_before) is not None:
        done.append(_attempt("remove_new_device_files", lambda: _remove_new_device_files(
            ctx.kernel.dev_dir, device_files)))
    if changes.promoted:
        done.append(_attempt("restore_host_ld_cache", lambda: ldcache.update_host(
            ctx.host, ctx.runner, ctx.install.lib64_host())))
    if all(done) and changes.readiness_before is not None:
        _attempt("restore_readiness", lambda: _restore_readiness(ctx, error))


def _attempt(action: str, fn: Callable[[], object]) -> bool:
    try:
        result = fn()
    except (InstallerError, OSError) as exc:
        log.warning("roll_back_incomplete", action=action,
                    error=getattr(exc, "message", None) or str(exc))
        return False
    return result is not False


def _reload_previous(ctx: Context, version: str) -> bool:
    """The driver this run unloaded, from the install dir it is recorded in."""
    record = cache.read(ctx.install.cache_file)
    problem = ("no intact install of it is recorded" if record is None
               or record.driver_version != version else cache.check_files(record, ctx.install.root))
    if problem:
        log.warning("previous_driver_not_reloaded", version=version, reason=problem,
                    hint="reboot the node or re-run install once the cause above is fixed")
        return False
    firmware.make_findable(ctx.kernel, ctx.host, ctx.install, ctx.install)
    modules.load(modules.plan_loads(ctx.install.drivers, _previous_module_args(ctx),
                                    display_modules=ctx.settings.display_modules),
                 ctx.kernel, ctx.runner, modprobe_root=ctx.modprobe_root)
    log.warning("previous_driver_reloaded", version=version)
    return True


def _previous_module_args(ctx: Context) -> tuple[ModuleArg, ...]:
    """The parameters the unloaded driver had: this boot's readiness file says (install
    read it first); when it does not, this run's."""
    loaded_with = ctx.journal.module_args_loaded
    return ctx.settings.module_args if loaded_with is None else loaded_with


def _make_device_files(ctx: Context) -> None:
    devnodes.create(ctx.install.bin / "nvidia-modprobe", ctx.kernel, ctx.runner,
                    _previous_module_args(ctx), on_bus=len(ctx.pci_gpus))


def _restore_readiness(ctx: Context, error: BaseException) -> bool:
    """The readiness file the run cleared, back when it names the loaded driver and this
    run did not find that driver broken (a failed check of a driver it never touched)."""
    changes = ctx.journal
    text = changes.readiness_before
    if text is None:
        return False
    named = readiness.parse(text).get("NVIDIA_DRIVER_VERSION")
    loaded = modules.loaded_driver_version(ctx.kernel)
    untouched = not changes.unloaded_version and "nvidia" not in changes.loaded
    step = error.context.get("step") if isinstance(error, InstallerError) else None
    if named != loaded:
        why = f"it names driver {named or '(none)'}, and {loaded or 'none'} is loaded"
    elif untouched and step in DRIVER_CHECKS:
        why = f"this run found driver {loaded} itself not working"
    else:
        readiness.restore(ctx.host, text)
        return True
    log.warning("readiness_not_restored", reason=why,
                hint="the file comes back once a run verifies the driver")
    return False


def _remove_new_device_files(dev_dir: Path, before: frozenset[str]) -> None:
    # Reversed: a dir's files ("nvidia-caps/nvidia-cap1") come before the dir itself.
    for rel in sorted(device_files(dev_dir) - before, reverse=True):
        path = dev_dir / rel
        if path.is_dir() and not path.is_symlink():
            path.rmdir()  # nvidia-caps/, new in this run and emptied just above
        else:
            path.unlink(missing_ok=True)
        log.info("device_file_removed", path=str(path))
