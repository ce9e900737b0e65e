"""The node's GPU health after the install: what ``sidecar health`` checks, and its verdict.

Once the install's init container has exited, the pod's main container is ``pause``: an Xid 79
(a GPU fallen off the bus), a GSP timeout or a dead daemon sidecar would show nowhere until a
workload failed. The health sidecar checks, every ``interval`` seconds, each check bounded:

- the kernel log since the loaded driver's load banner (``xid.since_driver_load``), the
  kernel's own ``NVRM:`` records only (``xid.Record.nvrm``: a user's write to /dev/kmsg is
  LOG_USER and never counts), each Xid classed by the action NVIDIA's Xid catalog gives it
  (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, "Resolution Bucket
  (Immediate Action)"): ``reboot`` (79), ``reset`` (RESET_GPU: 48, 63, 64, 95, 119, 120...:
  ``xid.NEEDS_RESET``), else ``app`` (the application may get past it: RESTART_APP, e.g. 94
  "contained ECC error", or IGNORE);
- the GPUs the driver has (``/proc/driver/nvidia/gpus/<bus>``) against those the install
  verified (status.json ``gpus``) and those this watcher has seen: one gone is a fault;
- the daemon sidecars' state files (``daemons.read_state``: exited, refused, or silent);
- the driver staged for the next boot (``nextboot.record``): no fault, but shown.

It reads only through the kernel roots (``KernelState``), the Runner and the install dir, and
never touches a GPU setting. The verdict is written to ``<install-dir>/daemons/health.json``
(doctor and the install read the daemons' files there), served as gauges (metrics_http), and
put in the readiness file's GPU_HEALTH lines when the install has written that file
(``publish``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import field
from pathlib import Path

import structlog

from installer.base.dataclass import dataclass
from installer.base.errors import InstallerError
from installer.base.fsutil import UnreadableFile, write_atomic
from installer.host.hostroot import HostRoot
from installer.host.installdir import InstallDir
from installer.host.runner import Runner
from installer.kmod import modules, xid
from installer.kmod.diagnostics import read_kernel_log
from installer.kmod.kernel import KernelState
from installer.records import metrics, readiness, status
from installer.records import staged_driver as nextboot
from installer.records.outcome import Outcome
from installer.services import supervise as daemons

log = structlog.get_logger(__name__)

HEALTH_FILE = "health.json"
INTERVAL_S = 30.0
# The action an Xid needs, worst first (the node's action is the worst of its events').
ACTIONS = ("reboot", "reset", "app")
DAEMON_NAMES = (daemons.FABRIC_MANAGER, daemons.PERSISTENCED)


def action_of(event: xid.Event) -> str:
    """``reboot``, ``reset`` or ``app`` (see the module's docstring for the source)."""
    return event.action or "app"


def bus_id(address: str) -> str:
    """One spelling of a PCI address: ``0000:00:04.0`` (/proc, sysfs) and nvidia-smi's
    ``00000000:00:04.0`` both become ``0000:00:04.0``, lower case."""
    domain, _, rest = address.strip().lower().rpartition(":")
    head, _, bus = domain.rpartition(":")
    return f"{int(head or '0', 16):04x}:{bus}:{rest}" if bus else address.strip().lower()


def driver_gpus(kernel: KernelState) -> frozenset[str]:
    """The GPUs the loaded driver has: the entries of /proc/driver/nvidia/gpus (nv.c makes
    one per GPU it probed, named by its PCI address: ``0000:00:06.0`` on the H100 node)."""
    gpus_dir = kernel.proc_dir / "driver/nvidia/gpus"
    try:
        return frozenset(bus_id(p.name) for p in gpus_dir.iterdir())
    except OSError:
        return frozenset()


def verified_gpus(outcome: Outcome | None) -> frozenset[str]:
    """The GPUs the last successful install verified (status.json ``gpus``)."""
    if outcome is None or outcome.outcome != "ok":
        return frozenset()
    return frozenset(bus_id(str(g["address"])) for g in outcome.gpus or ()
                     if isinstance(g.get("address"), str))


@dataclass(frozen=True)
class Health:
    """One check's findings; ``problems`` empty means healthy."""

    checked_at: float
    driver_version: str | None  # the loaded driver (None: not loaded)
    staged_version: str | None  # waiting in .next-boot for the next boot
    gpus_expected: int
    gpus_present: int
    xid_counts: dict[tuple[str, str], int] = field(default_factory=dict)  # (code, action)
    daemons: dict[str, str] = field(default_factory=dict)  # name -> state
    problems: tuple[str, ...] = ()
    action: str = "none"  # none | app | reset | reboot | check
    kernel_log: str = "ok"  # or why it could not be read

    @property
    def healthy(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, object]:
        return {"healthy": self.healthy, "action": self.action, "problems": list(self.problems),
                "driver_version": self.driver_version or "",
                "staged_for_next_boot": self.staged_version or "",
                "gpus_expected": self.gpus_expected, "gpus_present": self.gpus_present,
                "xid_events": [{"code": c, "action": a, "count": n}
                               for (c, a), n in sorted(self.xid_counts.items())],
                "daemons": self.daemons, "kernel_log": self.kernel_log,
                "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                            time.gmtime(self.checked_at))}


def xid_findings(records: list[xid.Record]) -> tuple[dict[tuple[str, str], int], list[str]]:
    """Xid/GSP events since the driver's load, counted by (code, action), and one problem
    line per distinct event that needs a reset or a reboot."""
    current, _ = xid.since_driver_load(records)
    events = xid.parse(current)
    counts = Counter((str(e.code) if e.code is not None else "gsp", action_of(e))
                     for e in events)
    serious = dict.fromkeys(e.describe() for e in events if action_of(e) != "app")
    return dict(counts), list(serious)


def gpu_findings(present: frozenset[str], expected: frozenset[str]) -> list[str]:
    gone = sorted(expected - present)
    return [f"GPU {addr} is gone from /proc/driver/nvidia/gpus" for addr in gone]


def daemon_findings(install_root: Path, now: float) -> tuple[dict[str, str], list[str]]:
    states: dict[str, str] = {}
    problems: list[str] = []
    for name in DAEMON_NAMES:
        state = daemons.read_state(install_root, name, now)
        if state is None:
            continue  # no such sidecar on this node
        states[name] = state.state
        if why := state.down():
            problems.append(f"the {name} sidecar is not running: {why}")
    return states, problems


def node_action(xid_counts: dict[tuple[str, str], int], problems: list[str]) -> str:
    """The worst action the findings need: an Xid's class, else ``check`` for another
    problem (a GPU gone, a daemon down), else ``none``."""
    for action in ACTIONS[:2]:
        if any(a == action for (_, a) in xid_counts):
            return action
    return "check" if problems else "none"


class Watcher:
    """The sidecar's state across checks: every GPU it has seen stays expected, so one that
    vanishes later is a fault even where status.json has no list."""

    def __init__(self, install: InstallDir, kernel: KernelState, runner: Runner,
                 host: HostRoot | None = None) -> None:
        self.install, self.kernel, self.runner = install, kernel, runner
        self.host = host  # where the readiness file is (None: not told the verdict)
        self.seen: frozenset[str] = frozenset()
        self.last: Health | None = None

    def check(self, now: float | None = None) -> Health:
        now = time.time() if now is None else now
        version = modules.loaded_driver_version(self.kernel)
        present = driver_gpus(self.kernel) if version else frozenset()
        outcome = _last_outcome(self.install)
        expected = self.seen | verified_gpus(outcome) | present
        self.seen = expected
        problems = [] if version else ["the nvidia kernel module is not loaded"]
        problems += gpu_findings(present, expected)
        records = read_kernel_log(self.kernel, self.runner)
        counts: dict[tuple[str, str], int] = {}
        kernel_log = "ok"
        if isinstance(records, str):
            kernel_log = records
        else:
            counts, xid_problems = xid_findings(records)
            problems += xid_problems
        states, daemon_problems = daemon_findings(self.install.root, now)
        problems += daemon_problems
        staged = nextboot.record(self.install)
        self.last = Health(now, version, staged.driver_version if staged else None,
                           len(expected), len(present), counts, states, tuple(problems),
                           node_action(counts, problems), kernel_log)
        return self.last


def _last_outcome(install: InstallDir) -> Outcome | None:
    try:
        return status.read(install.status_file)
    except UnreadableFile:
        return None


def write_status(install_root: Path, health: Health) -> None:
    """``<install-dir>/daemons/health.json``, atomically: the verdict and why."""
    path = install_root / daemons.STATE_DIR / HEALTH_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(health.to_json(), sort_keys=True) + "\n")


def readiness_lines(health: Health) -> tuple[str, str]:
    """driver-ready's GPU_HEALTH (``ok``, or the action: reset, reboot, check) and
    GPU_HEALTH_REASON (the problems, ``; ``-joined; empty when ok)."""
    action = "ok" if health.healthy else health.action
    return action, "; ".join(health.problems)


def publish(host: HostRoot | None, health: Health) -> bool:
    """The verdict into the readiness file, if the install wrote one and it says otherwise
    (readiness.set_health: no write while it already says this, none without the file)."""
    if host is None:
        return False
    return readiness.set_health(host, *readiness_lines(health))


def _publish_logged(host: HostRoot | None, health: Health) -> None:
    try:
        publish(host, health)
    except (OSError, InstallerError) as exc:  # the verdict stands in health.json and /metrics
        log.warning("readiness_health_not_written", error=f"{type(exc).__name__}: {exc}")


def read_status(install_root: Path) -> dict[str, object] | None:
    try:
        doc = json.loads((install_root / daemons.STATE_DIR / HEALTH_FILE)
                         .read_text(errors="replace")[:65536])
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def format_gauges(health: Health | None) -> str:
    """The health gauges in the Prometheus text format (docs/health-and-metrics.md lists
    them); before the first check, ``health_checked`` 0 alone."""
    p = f"{metrics.METRIC_PREFIX}_health"
    out = [f"# HELP {p}_checked 1 once the health sidecar has checked the node.",
           f"# TYPE {p}_checked gauge", f"{p}_checked {0 if health is None else 1}"]
    if health is None:
        return "\n".join(out) + "\n"
    label = metrics.label_value
    gauges = [
        ("ok", "1 while the last check found no problem, else 0.",
         [f"{p}_ok {int(health.healthy)}"]),
        ("action", "1 for the action the node needs (none, app, reset, reboot, check).",
         [f'{p}_action{{action="{a}"}} {int(a == health.action)}'
          for a in ("none", "app", "reset", "reboot", "check")]),
        ("problems", "How many problems the last check found.",
         [f"{p}_problems {len(health.problems)}"]),
        ("gpus_expected", "GPUs the install verified or the watcher has seen.",
         [f"{p}_gpus_expected {health.gpus_expected}"]),
        ("gpus_present", "GPUs the loaded driver has now (/proc/driver/nvidia/gpus).",
         [f"{p}_gpus_present {health.gpus_present}"]),
        ("driver_loaded", "1 with the nvidia module loaded; its version as a label.",
         [f'{p}_driver_loaded{{driver_version="{label(health.driver_version or "")}"}} '
          f"{int(health.driver_version is not None)}"]),
        ("staged_for_next_boot", "1 while a driver version waits in .next-boot for the "
         "next boot (drain and reboot to switch), else 0.",
         [f'{p}_staged_for_next_boot{{driver_version="{label(health.staged_version or "")}"}}'
          f" {int(health.staged_version is not None)}"]),
        ("xid_events", "Xid/GSP events in the kernel log since the driver's load, by code "
         "and the action NVIDIA's Xid catalog gives it (app, reset, reboot).",
         [f'{p}_xid_events{{code="{c}",action="{a}"}} {n}'
          for (c, a), n in sorted(health.xid_counts.items())]),
        ("kernel_log_readable", "1 when the kernel log could be read, else 0.",
         [f"{p}_kernel_log_readable {int(health.kernel_log == 'ok')}"]),
        ("daemon_up", "Per daemon sidecar: 1 while it runs (or idles), else 0.",
         [f'{p}_daemon_up{{daemon="{n}"}} {int(s in (daemons.RUNNING, daemons.IDLE))}'
          for n, s in sorted(health.daemons.items())]),
        ("last_check_timestamp_seconds", "When the last check ran (Unix time).",
         [f"{p}_last_check_timestamp_seconds {health.checked_at:.0f}"]),
    ]
    for name, help_text, samples in gauges:
        out += [f"# HELP {p}_{name} {help_text}", f"# TYPE {p}_{name} gauge", *samples]
    return "\n".join(out) + "\n"


def install_metrics(install: InstallDir, kernel: KernelState) -> str:
    """The install's own metrics (metrics.format_metrics) from its status.json; empty
    before any run recorded one."""
    outcome = _last_outcome(install)
    if outcome is None:
        return ""
    return metrics.format_metrics(outcome, kernel_release=kernel.release(),
                                  finished_at=_status_mtime(install))


def _status_mtime(install: InstallDir) -> float | None:
    try:
        return install.status_file.stat().st_mtime
    except OSError:
        return None


def watch(watcher: Watcher, interval_s: float, *, checks: int | None = None,
          sleep: Callable[[float], None] = time.sleep) -> None:
    """Check, record the verdict, sleep ``interval_s``; ``checks`` times (None: until the
    process is stopped). A check that fails is logged and the last verdict kept."""
    verdict: tuple[str, ...] | None = None
    done = 0
    while checks is None or done < checks:
        try:
            found = watcher.check()
            write_status(watcher.install.root, found)
        except Exception as exc:  # noqa: BLE001 (the watcher must outlive one bad check)
            log.warning("health_check_failed", error=f"{type(exc).__name__}: {exc}")
        else:
            if found.problems != verdict:
                emit = log.info if found.healthy else log.warning
                emit("health_verdict", healthy=found.healthy, action=found.action,
                     problems=list(found.problems), driver_version=found.driver_version,
                     staged_for_next_boot=found.staged_version)
                verdict = found.problems
            _publish_logged(watcher.host, found)
        done += 1
        if checks is None or done < checks:
            sleep(interval_s)
