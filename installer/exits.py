"""The one boundary (docs/contract.md §3): how a command's failure ends the process: its exit code,
one final event (class, code, error, hint, log tails) and a last sentence saying what
happened and what to do; bugs with their traceback, secrets scrubbed. ``cli.main`` runs
every command through it."""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

import click
import structlog

from installer.base.errors import InstallerError, UsageError
from installer.log import configure
from installer.net.policy import scrub_text

# What to do next, per failure class, when the error carries no hint of its own.
NEXT_STEP = {
    "usage": "fix the option or environment variable named above and re-run",
    "unsupported_host": "run this installer on Container-Optimized OS or Ubuntu nodes",
    "locked": "another installer is running on this node: let it finish, or raise --lock-timeout",
    "download": "check the node can reach the URL above (proxy, firewall, version exists), "
                "then re-run",
    "integrity": "re-run to download again; if it persists, check the mirror and --driver-sha256",
    "build": "read the nvidia-installer.log lines above; check the headers match the kernel",
    "module_load": "read the kernel log lines above; drain GPU workloads if the driver is in use",
    "verify": "run `nvidia-driver-installer doctor` on the node for a full check",
    "secure_boot": "disable Secure Boot / module.sig_enforce on the node pool, or use signed modules",
    "disk_space": "free disk space on the node and re-run",
    "not_installed": "run install on this node",
}

TAIL_FIELDS = ("installer_log_tail", "kernel_log_tail")


def failure_message(exc: InstallerError) -> str:
    """The last line, in words: what happened and what to do next."""
    step = exc.context.get("step")
    where = f" in step {step}" if step else ""
    nxt = exc.hint or NEXT_STEP.get(exc.error_class, "see the log above")
    return (f"FAILED{where} ({exc.error_class}, exit {int(exc.exit_code)}): "
            f"{_sentence(exc.message)} What to do: {_sentence(nxt)}")


def _sentence(text: str) -> str:
    """``text`` ending in one full stop (a message may already end in one)."""
    text = text.rstrip()
    return text if text.endswith((".", "!", "?")) else text + "."


def _json_logging() -> bool:
    processors = structlog.get_config().get("processors") or []
    return bool(processors) and isinstance(processors[-1], structlog.processors.JSONRenderer)


def report_click_error(exc: click.ClickException, command: str, argv: list[str]) -> None:
    """A bad option or argument as click found it: click's own message, or with JSON logs
    asked for a JSON event too; ``install -o json`` prints its failure document."""
    if not isinstance(exc, click.UsageError):
        exc.show()
        return
    usage = UsageError(exc.format_message())
    if json_logs_requested(argv):
        configure("json")  # tools reading JSON lines get this one too
        report_failure(usage, command, argv)
    else:
        exc.show()
        failure_json(command, argv, usage)


def report_bug(exc: Exception, command: str, argv: list[str] | None = None) -> None:
    """A bug: the traceback (secrets scrubbed), then one final ``internal`` event."""
    sys.stderr.write(scrub_text(traceback.format_exc()))
    report_failure(InstallerError(
        f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
        hint="this is a bug in the installer: report it with the traceback above"), command,
        argv)


def report_interrupt(exc: Any, command: str, argv: list[str] | None = None) -> None:
    """The final event of a run stopped by SIGTERM / SIGINT (children stopped, lock released,
    the live install untouched: all done while unwinding)."""
    if not structlog.is_configured():
        configure("auto")
    message = (f"INTERRUPTED by {exc.name} (exit {exc.exit_code}): child processes stopped, "
               "host lock released, the last good install kept. What to do: re-run to finish "
               "(the pod restarts the installer by itself).")
    structlog.get_logger("installer").warning(
        f"{command}_interrupted", signal=exc.name, exit_code=exc.exit_code, message=message)
    failure_json(command, argv, None, outcome="interrupted", error_class="interrupted",
                 exit_code=exc.exit_code, message=f"interrupted by {exc.name}")


def report_failure(exc: InstallerError, command: str = "install",
                   argv: list[str] | None = None) -> None:
    """One final event: class, exit code, error, hint, log tails and a sentence (and with
    ``install -o json`` in ``argv``, the failure on stdout: failure_json).

    JSON logs: that event is the last line. Console: the log tails are printed as
    indented blocks before it, and its sentence is the very last line (installer.log).
    """
    if not structlog.is_configured():
        configure("auto")
    log = structlog.get_logger("installer")
    message = failure_message(exc)
    context = dict(exc.context)
    console = not _json_logging()
    if console:
        for key in TAIL_FIELDS:
            lines = context.pop(key, None)
            if lines:
                title = key.replace("_tail", "").replace("_", " ")
                click.echo(f"last lines of the {title}:", err=True)
                click.echo(scrub_text("\n".join("    " + ln for ln in lines)), err=True)
    log.error(
        f"{command}_failed",
        error_class=exc.error_class,
        exit_code=int(exc.exit_code),
        error=exc.message,
        hint=exc.hint,
        **context,
        message=message,  # the console prints it last, on a line of its own
    )
    failure_json(command, argv, exc)


def failure_json(command: str, argv: list[str] | None, exc: InstallerError | None,
                 **doc: Any) -> None:
    """``install -o json``: a failed run's outcome on stdout as a successful one's is (issue
    34), so a tool reading stdout gets one JSON document whatever happened, dry runs
    included. (The other commands print their document before they fail.)"""
    if argv is None or command != "install" or not _output_json_requested(argv):
        return
    if exc is not None:
        doc = {"outcome": "error", "error_class": exc.error_class, "exit_code": int(exc.exit_code),
               "message": exc.message, "hint": exc.hint,
               **{k: v for k, v in exc.context.items() if k not in TAIL_FIELDS}}
    if "--dry-run" in argv:
        doc["dry_run"] = True
    click.echo(scrub_text(json.dumps(doc, indent=2, default=str)))


def _output_json_requested(args: list[str]) -> bool:
    """``-o json``, ``-ojson``, ``--output json`` or ``--output=json`` among the arguments,
    read without click (which may have failed to parse them)."""
    for i, arg in enumerate(args):
        if arg in ("-o", "--output") and i + 1 < len(args):
            if args[i + 1] == "json":
                return True
        elif arg in ("-ojson", "--output=json"):
            return True
    return False


def json_logs_requested(argv: list[str]) -> bool:
    """--log-format json or LOG_FORMAT=json, read before click could parse the options."""
    for i, arg in enumerate(argv):
        if arg.startswith("--log-format="):
            return arg.partition("=")[2].lower() == "json"
        if arg == "--log-format" and i + 1 < len(argv):
            return argv[i + 1].lower() == "json"
    return os.environ.get("LOG_FORMAT", "").strip().lower() == "json"
