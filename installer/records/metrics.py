"""An optional node_exporter textfile (``--metrics-file``, a host path): a Prometheus
text file for the textfile collector, written on success and on failure."""

from __future__ import annotations

import time
from pathlib import Path, PurePosixPath

import structlog

from installer.base.errors import InstallerError
from installer.host.hostroot import HostRoot
from installer.records.outcome import OK, Outcome

log = structlog.get_logger(__name__)

METRIC_PREFIX = "nvidia_driver_installer"


def label_value(value: object) -> str:
    """A label value escaped as the Prometheus text format wants it."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_metrics(outcome: Outcome, *, kernel_release: str,
                   finished_at: float | None = None) -> str:
    """node_exporter textfile: HELP/TYPE lines, one sample per metric. ``_info`` names the
    driver that runs; a version staged for the next boot has a metric of its own."""
    labels = (f'driver_version="{label_value(outcome.driver_version or "")}",'
              f'plan="{label_value(outcome.plan or "")}",'
              f'kernel_release="{label_value(kernel_release)}",outcome="{label_value(outcome.outcome)}",'
              f'error_class="{label_value(outcome.error_class or "")}"')
    staged_version = outcome.staged_driver_version if outcome.staged else None
    p = METRIC_PREFIX
    samples = [
        ("info", "gauge", "The last run: driver version, plan, kernel, outcome (always 1).",
         f"{p}_info{{{labels}}} 1"),
        ("success", "gauge", "1 if the last run installed and verified the driver (or, with "
         "a version staged for the next boot, verified the running one), else 0.",
         f"{p}_success {1 if outcome.outcome == OK else 0}"),
        ("staged_for_next_boot", "gauge", "1 while a driver version waits for the next boot "
         "(the running one is in use; drain and reboot to switch), else 0.",
         f'{p}_staged_for_next_boot{{driver_version="{label_value(staged_version or "")}"}} '
         f'{1 if staged_version else 0}'),
        ("cuda_check_deferred", "gauge", "1 while the CUDA proof waits for MIG instances "
         "(a GPU in MIG mode without instances is no CUDA device; verify proves it once the "
         "partitioner made them), else 0.",
         f'{p}_cuda_check_deferred{{detail="{label_value(outcome.cuda_check or "")}"}} '
         f'{1 if outcome.cuda_deferred else 0}'),
        ("exit_code", "gauge", "Exit code of the last run (0 ok; see the README).",
         f"{p}_exit_code {outcome.exit_code}"),
        ("duration_seconds", "gauge", "Wall time of the last run.",
         f"{p}_duration_seconds {outcome.duration_s or 0:.3f}"),
        ("last_run_timestamp_seconds", "gauge", "When the last run finished (Unix time).",
         f"{p}_last_run_timestamp_seconds {finished_at if finished_at is not None else time.time():.0f}"),
    ]
    out = []
    for name, kind, help_text, sample in samples:
        out += [f"# HELP {p}_{name} {help_text}", f"# TYPE {p}_{name} {kind}", sample]
    return "\n".join(out) + "\n"


def write_metrics(host: HostRoot, host_path: PurePosixPath, text: str) -> Path | None:
    """Write the textfile atomically; a failure is logged, never fatal."""
    try:
        path = host.write_atomic(host_path, text)  # temp name ends in .tmp: the collector skips it
    except (OSError, InstallerError) as exc:
        log.warning("metrics_not_written", path=str(host_path), error=str(exc),
                    hint="check --metrics-file names a writable host path")
        return None
    log.info("metrics_written", path=str(host_path))
    return path
