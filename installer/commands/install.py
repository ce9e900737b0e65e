"""The install command: detect, plan, lock, execute, record the outcome."""

from __future__ import annotations

import time
from dataclasses import asdict, replace

import structlog

from installer import __version__, distros, rollback
from installer.base.errors import InstallerError, VerifyError
from installer.base.fsutil import remove_tree
from installer.base.signals import Interrupted
from installer.context import Context
from installer.detect import context, probe
from installer.distros import flows
from installer.distros.planning import Flow
from installer.host.lock import HostLock
from installer.kmod.diagnostics import failure_details
from installer.kmod.moduleargs import ModuleArg, for_module
from installer.net.policy import scrub
from installer.plan import Plan, StepTiming, execute
from installer.records import cache, metrics, readiness, status
from installer.records.journal import ReadinessCleared
from installer.records.outcome import DRY_RUN, ERROR, INTERRUPTED, OK, Outcome
from installer.records.results import (
    GpusChecked,
    InUse,
    KeptForNextBoot,
    ModuleArgsWaiting,
    PersistenceModeSet,
    Verified,
)
from installer.services import verify
from installer.settings import Settings

log = structlog.get_logger(__name__)


def run(settings: Settings) -> Outcome:
    """The ``install`` command: install (or plan, with --dry-run), then log the outcome."""
    started = time.monotonic()
    outcome = _install(settings, started)
    log.info("install_finished", outcome=outcome.outcome, plan=outcome.plan,
             driver_version=outcome.driver_version,
             staged_driver_version=outcome.staged_driver_version,
             duration_s=round(time.monotonic() - started, 3), message=_success_message(outcome))
    return outcome


def _success_message(outcome: Outcome) -> str:
    if outcome.staged:
        return (f"NVIDIA driver {outcome.driver_version} keeps running (in use: "
                f"{outcome.in_use_by}) and verified; {outcome.staged_driver_version} is "
                "staged and installs at the next boot (drain and reboot the node to switch)")
    if outcome.outcome == DRY_RUN:
        return f"dry run: printed the {outcome.plan} plan, changed nothing"
    if outcome.plan == "preload":
        return "preload done: COS toolchain and kernel headers cached; no driver installed"
    if outcome.install_only:
        return (f"NVIDIA driver {outcome.driver_version} is in the install dir; "
                "--install-only: nothing loaded or verified")
    how = "loaded from the cache" if outcome.plan == "cached" else "installed"
    done = f"NVIDIA driver {outcome.driver_version} {how} and verified"
    if outcome.module_args_waiting:
        done += (f"; it keeps the module parameters it was loaded with (in use: "
                 f"{outcome.in_use_by}): {' '.join(outcome.module_args_waiting)} apply at its "
                 "next load")
    return done


def _log_host(ctx: Context) -> None:
    # os and kernel_release are bound to every event already; the distro is what "flow" says.
    info = ctx.host_info
    log.info("host_detected", flow=info.distro, support=distros.support(info),
             version_id=info.version_id, pretty_name=info.pretty_name, build_id=info.build_id,
             board=info.board)


def _install(settings: Settings, started: float) -> Outcome:
    ctx = context(settings)
    structlog.contextvars.bind_contextvars(os=ctx.host_info.os_id,
                                           kernel_release=ctx.host_info.kernel_release)
    distro = flows.for_host(ctx.host_info)
    distro.check_settings(ctx)
    ctx.install.check_writable()  # before the lock and readiness: nothing changed yet
    _log_host(ctx)
    if settings.dry_run:
        return _dry_run(ctx, distro)
    with HostLock(ctx.host, settings.lock_timeout_s):
        # Under the lock (root and a writable host are the lock's to name first), before
        # anything changes: the host paths we write must name this very install dir.
        ctx.install.check_host_path(ctx.host.resolve(ctx.install.host_path))
        # What this boot's file says the loaded modules got (it lives in /run), then gone:
        # consumers waiting on driver-ready must not start while the driver may change.
        # A failed run puts it back if the node is as it was (rollback.undo).
        if (found := readiness.read_text(ctx.host)) is not None:
            ctx.journal.note(ReadinessCleared(found))
        readiness.clear(ctx.host)
        started_wall = time.time()
        timings: list[StepTiming] = []
        plan = None
        try:
            ctx = probe(ctx)  # the node as the plan sees it, read under the lock
            plan = distro.plan(ctx)
            log.info("plan_ready", kind=plan.kind, steps=[s.name for s in plan.steps],
                     **plan.summary)
            _warn_unpinned(ctx, plan, distro)
            execute(plan, ctx, timings)
            if (verified := ctx.results.get(Verified)) is not None:  # none for --preload
                _write_ready(ctx, plan, len(verified.gpus))
        except InstallerError as exc:
            exc.context.update(failure_details(ctx.install, ctx.kernel, ctx.runner,
                                               exc.error_class, started_wall))
            _discard(ctx, exc)
            _record(ctx, started, timings, plan, Outcome(
                ERROR, int(exc.exit_code), error_class=exc.error_class, message=exc.message,
                hint=exc.hint, context=exc.context))
            raise
        except Interrupted as exc:  # SIGTERM/SIGINT: the live install stays as it was
            _discard(ctx, exc)
            _record(ctx, started, timings, plan, Outcome(
                INTERRUPTED, exc.exit_code, error_class="interrupted",
                message=f"interrupted by {exc.name}", hint="re-run install to finish"))
            raise
        except Exception as exc:  # a bug: the node back as it was, and a status to find
            _discard(ctx, exc)
            _record(ctx, started, timings, plan, Outcome(
                ERROR, 1, error_class="internal", message=f"{type(exc).__name__}: {exc}",
                hint="this is a bug in the installer: report it with the traceback"))
            raise
        return _record(ctx, started, timings, plan, _succeeded(ctx, plan))


def _succeeded(ctx: Context, plan: Plan) -> Outcome:
    """A run that finished, as the step results say: what was verified, what waits."""
    staged, waiting = _kept_for_next_boot(ctx), ctx.results.get(ModuleArgsWaiting)
    verified = ctx.results.get(Verified)
    return Outcome(
        OK, 0, install_only=ctx.settings.install_only,
        cuda_check=_check_results(ctx).get("CUDA_CHECK"),
        gpus=tuple(asdict(g) for g in verified.gpus) if verified else (),
        driver_version=staged.running_version if staged else None,
        staged_driver_version=plan.driver_version if staged else None,
        in_use_by=staged.holders if staged else waiting.holders if waiting else None,
        module_args_waiting=tuple(map(str, ctx.settings.module_args)) if waiting else None)


def _dry_run(ctx: Context, distro: Flow) -> Outcome:
    """The plan, once its pre-flight checks pass: what the real run refuses, this refuses
    with the same exit code and message (and a plan is printed only if it could work)."""
    # The real run's first check under the lock (exit 2): the dry run takes no lock, but
    # refuses the same install-dir mismatch.
    ctx.install.check_host_path(ctx.host.resolve(ctx.install.host_path))
    ctx = probe(ctx)
    plan = distro.plan(ctx)
    execute(plan, ctx, [], checks_only=True)
    _warn_unpinned(ctx, plan, distro)
    doc = {"dry_run": True, "host": ctx.host_info.to_dict(),
           "install_dir": str(ctx.install.root), **plan.describe(),
           "module_args": _module_args(ctx.settings.module_args),
           "readiness_file": str(readiness.READY_HOST_PATH)}
    checked = ctx.results.get(GpusChecked)
    if checked is not None and checked.no_gpu is not None:
        doc["no_gpu"] = checked.no_gpu
    for gpu in ctx.assumed_gpus:  # --gpu-model: one, on a bus without an NVIDIA GPU
        doc["assumed_gpu"] = {**gpu.to_dict(), "requested": ctx.settings.dry_run_gpu_model}
    return Outcome(DRY_RUN, plan=plan.kind, dry_run=scrub(doc))


def _module_args(args: tuple[ModuleArg, ...]) -> dict[str, list[str]]:
    """--module-arg (NVIDIA_MODULE_ARGS) per kernel module, as insmod will get them."""
    names = dict.fromkeys(a.module for a in args)
    return {name: [a.insmod_word for a in for_module(name, args)] for name in names}


def _discard(ctx: Context, error: BaseException) -> None:
    """After a failed or interrupted run: the node goes back to how it was (the driver it
    had, loaded from the live install, and its readiness), and what the run half-made goes."""
    rollback.undo(ctx, error)
    ctx.install.discard_staging()
    for path in ctx.journal.scratch:
        remove_tree(path)


def _warn_unpinned(ctx: Context, plan: Plan, distro: Flow) -> None:
    """A plan that downloads and runs the NVIDIA .run as root (Plan.runs_downloaded_run)
    says so when nothing pins it."""
    if not plan.runs_downloaded_run:
        return
    unpinned = []
    if not (ctx.settings.driver_sha256 or plan.driver_sha256):
        unpinned.append("the NVIDIA .run (--driver-sha256)")
    if (artifacts := distro.unpinned_artifacts(ctx.settings)) is not None:
        unpinned.append(artifacts)
    if unpinned:
        log.warning("artifacts_unpinned", unpinned=unpinned,
                    driver_url=plan.driver_url,
                    message=f"not pinned: {' and '.join(unpinned)}; whatever the server "
                    "sends is installed (the .run runs as root): pin it for production")


def _write_ready(ctx: Context, plan: Plan, gpu_count: int) -> None:
    """driver-ready, written last: everything above verified the driver."""
    checked = ctx.results.get(GpusChecked)
    module_type = (checked.module_type if checked else None) or plan.kernel_module_type
    try:
        _write_ready_file(ctx, plan, gpu_count, module_type)
    except OSError as exc:
        raise VerifyError(
            f"the driver works but the readiness file could not be written: {exc}",
            hint="the host's /run must be writable from the installer (the pod mounts / at "
            "/root); components waiting for driver-ready stay blocked until then",
            path=str(readiness.READY_HOST_PATH),
        ) from exc


def _write_ready_file(ctx: Context, plan: Plan, gpu_count: int, module_type: str | None) -> None:
    """The driver that runs now; with a version staged for the next boot, that one as
    pending (and the running one's module type from its own .cache record)."""
    staged = _kept_for_next_boot(ctx)
    if staged is not None:
        record = cache.read(ctx.install.cache_file)
        module_type = record.module_type if record else None
    driver = readiness.ReadyDriver(
        driver_version=staged.running_version if staged else plan.driver_version,
        plan=plan.kind, module_type=module_type, gpu_count=gpu_count,
        persistence_mode=_persistence_mode(ctx),
        pending_driver_version=plan.driver_version if staged else None,
        module_args=_module_args_in_effect(ctx))
    readiness.write(ctx.host, readiness.ready_fields(
        driver, install_dir_host=ctx.install.host_path,
        kernel_release=ctx.host_info.kernel_release, installer_version=__version__,
        checks=_check_results(ctx)))


def _kept_for_next_boot(ctx: Context) -> InUse | None:
    """The running driver a staged plan left in place (stage_next_boot's result)."""
    kept = ctx.results.get(KeptForNextBoot)
    return kept.in_use if kept else None


def _persistence_mode(ctx: Context) -> str:
    """"on" or "failed" when the persistence_mode step ran, else "off"."""
    done = ctx.results.get(PersistenceModeSet)
    return done.state if done else "off"


def _check_results(ctx: Context) -> dict[str, str]:
    """Each readiness check's result (``unchecked`` where no verify ran)."""
    verified = ctx.results.get(Verified)
    return verify.check_results(verified.checks if verified else {})


def _module_args_in_effect(ctx: Context) -> tuple[ModuleArg, ...]:
    """The parameters the loaded driver has: this run's when it loaded nvidia (or nothing
    says otherwise), else what this boot's readiness file said."""
    loaded_with = ctx.journal.module_args_loaded
    if "nvidia" in ctx.journal.loaded or loaded_with is None:
        return ctx.settings.module_args
    return loaded_with


def _record(ctx: Context, started: float, timings: list[StepTiming], plan: Plan | None,
            outcome: Outcome) -> Outcome:
    """``outcome`` completed with what every run records, written to status.json and the
    metrics textfile. Its driver version, unless set: the plan's."""
    outcome = replace(
        outcome,
        plan=plan.kind if plan else None,
        driver_version=outcome.driver_version or (plan.driver_version if plan else None),
        host=ctx.host_info.to_dict(),
        install_dir_host=str(ctx.install.host_path),
        steps=tuple(asdict(t) for t in timings),
        duration_s=round(time.monotonic() - started, 3),
        external_commands_s=round(ctx.runner.total_s, 3),
    )
    if ctx.install.root.is_dir():
        outcome = status.write(ctx.install.status_file, outcome)
    if ctx.settings.metrics_file is not None:
        metrics.write_metrics(ctx.host, ctx.settings.metrics_file, metrics.format_metrics(
            outcome, kernel_release=ctx.host_info.kernel_release))
    return outcome
