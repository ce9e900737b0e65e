"""The GPU conformance tier (``make test-gpu``): the installer's read-only commands against a
real NVIDIA GPU node, changing nothing on it (tests/gpu/guard.py: how that is enforced).

Environment:
  NDI_GPU=1               run it even when pytest is not pointed at tests/gpu (plain
                          ``pytest`` skips it: it is ``make test-gpu``'s)
  NDI_GPU_REQUIRED=1      no usable GPU is a failure (one line, exit 1), not a skip
  NDI_GPU_INSTALL_DIR     the driver's user space (bin/nvidia-smi, lib64/) to pass as
                          --install-dir; default: the installer's own install dir if it holds
                          a .cache record, else the parent of the dir of nvidia-smi on PATH
  NDI_GPU_REPORT_DIR      where the report goes (default /tmp/ndi-gpu-report):
                          gpu-conformance.json, gpu-conformance.txt, timings.json
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import pytest

from tests import tiers
from tests.gpu import guard
from tests.gpu.node import SYS, GpuNode, absent_reason, choose_install_dir, find_smi, nvidia_pci

HERE = Path(__file__).resolve().parent
REPORT: dict[str, object] = {"checks": {}}
_STATE: dict[str, object] = {}


def _asked_for_gpu(config: pytest.Config) -> bool:
    """True when the command line names this tier's dir (or something in it), or NDI_GPU=1."""
    return tiers.asked_for(config, HERE, "NDI_GPU")


def gate() -> tuple[GpuNode | None, str | None]:
    """The node, or why the tier cannot run here (one line). Decided once per session."""
    if "gate" not in _STATE:
        install_dir, why = choose_install_dir(dict(os.environ))
        smi = find_smi(install_dir)
        reason = absent_reason(SYS, smi)
        if reason is None and os.geteuid() != 0:
            reason = "the GPU tier needs root (private mount namespaces: unshare --mount)"
        if reason is None and install_dir is None:
            reason = why
        node = None
        if reason is None:
            assert install_dir is not None and smi is not None
            node = GpuNode(install_dir, why, smi, nvidia_pci(SYS),
                           (install_dir / ".cache").is_file())
        _STATE["gate"] = (node, reason)
    return _STATE["gate"]  # type: ignore[return-value]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [i for i in items if HERE in Path(str(i.path)).parents]
    if not mine:
        return
    if not _asked_for_gpu(config):
        skip = pytest.mark.skip(reason="GPU tier: run `make test-gpu` (or pytest tests/gpu)")
        for item in mine:
            item.add_marker(skip)
        return
    _STATE["asked"] = True
    node, reason = gate()
    if node is None and os.environ.get("NDI_GPU_REQUIRED") == "1":
        REPORT["skipped"] = reason
        _write_report(config)
        pytest.exit(f"GPU tier FAILED: NDI_GPU_REQUIRED=1 but {reason}", returncode=1)
    if node is None:  # one marker, one file: pytest -ra folds it into one line
        skip = pytest.mark.skip(reason=f"GPU tier skipped: {reason} (NDI_GPU_REQUIRED=1 makes "
                                "this a failure)")
        for item in mine:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_node() -> GpuNode:
    node, reason = gate()
    if node is None:
        pytest.skip(f"GPU tier skipped: {reason} (NDI_GPU_REQUIRED=1 makes this a failure)")
    return node


@pytest.fixture(scope="session", autouse=True)
def read_only(gpu_node: GpuNode):
    """The guard on for the whole tier, and the node's state the same at the end as at the
    start: loaded modules, the driver's params, the node's /dev/nvidia*, nvidia-smi's
    persistence, MIG, compute mode, clocks, ECC and power limit."""
    guard.install()
    guard.ENFORCE = True
    before = gpu_node.snapshot()
    REPORT["state_before"] = before
    yield
    after = gpu_node.snapshot()
    guard.ENFORCE = False
    REPORT["state_after"] = after
    changed = {k: {"before": before[k], "after": after[k]} for k in before if before[k] != after[k]}
    REPORT["state_unchanged"] = not changed
    assert not changed, f"the node's state changed during the read-only tier: {changed}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    rep = outcome.get_result()
    if HERE not in Path(str(item.path)).parents:
        return
    entry = REPORT["checks"].setdefault(item.name, {"outcome": "passed", "duration_s": 0.0})
    entry["duration_s"] = round(entry["duration_s"] + rep.duration, 3)
    if rep.failed:
        entry["outcome"] = "failed" if rep.when == "call" else f"error ({rep.when})"
        entry["message"] = str(rep.longreprtext)[-2000:]
    elif rep.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
        entry["message"] = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)


def report_dir() -> Path:
    return Path(os.environ.get("NDI_GPU_REPORT_DIR") or "/tmp/ndi-gpu-report")


def _write_report(config: pytest.Config) -> None:
    node, reason = gate()
    REPORT.update({
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "kernel": platform.release(),
        "install_dir": str(node.install_dir) if node else None,
        "install_dir_why": node.install_dir_why if node else None,
        "install_record": node.has_record if node else None,
        "pci": [f.__dict__ for f in nvidia_pci(SYS)],
    })
    if node is not None:
        REPORT.update(node.results)
    if reason:
        REPORT["skipped"] = reason
    out = report_dir()
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu-conformance.json").write_text(json.dumps(REPORT, indent=2, default=str) + "\n")
        (out / "gpu-conformance.txt").write_text(render_text(REPORT))
    except OSError as exc:
        print(f"GPU tier: cannot write the report to {out}: {exc}")
        return
    config.stash[_REPORT_KEY] = str(out)


_REPORT_KEY = pytest.StashKey[str]()


def render_text(report: dict) -> str:
    lines = ["nvidia-driver-installer GPU conformance tier (read-only)",
             f"finished: {report.get('finished_at')}", f"kernel: {report.get('kernel')}"]
    if report.get("skipped"):
        lines.append(f"not run: {report['skipped']}")
    for key in ("device", "driver_version", "install_dir", "install_dir_why", "install_record",
                "state_unchanged"):
        if key in report:
            lines.append(f"{key}: {report[key]}")
    for name, c in report.get("checks", {}).items():
        lines.append(f"  {c['outcome']:<8} {name} ({c['duration_s']}s)")
        if c.get("message") and c["outcome"] != "passed":
            lines.append("           " + c["message"].strip().splitlines()[-1][:300])
    if report.get("timings"):
        lines.append(f"timings: {json.dumps(report['timings'])}")
    return "\n".join(lines) + "\n"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _STATE.get("asked"):
        _write_report(session.config)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    where = config.stash.get(_REPORT_KEY, None)
    if where:
        terminalreporter.write_line(f"GPU tier report: {where}/gpu-conformance.{{json,txt}}")
