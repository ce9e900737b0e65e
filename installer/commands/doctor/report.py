"""Every check in the order a person would look, run into one report, rendered as a
table or JSON."""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Callable
from dataclasses import asdict

from installer.base.dataclass import dataclass
from installer.base.errors import ExitCode
from installer.commands.doctor.driver import (
    check_dev_char,
    check_device_nodes,
    check_gpu_firmware,
    check_host_ld_cache,
    check_kernel_modules,
    check_nvidia_smi,
)
from installer.commands.doctor.host import (
    check_device_plugin,
    check_disk,
    check_gke_installer,
    check_gpus,
    check_host,
    check_module_signing,
    check_modules_disabled,
)
from installer.commands.doctor.installed import (
    check_cache,
    check_driver_branch,
    check_install_dir,
    check_installer_status,
    check_readiness,
)
from installer.commands.doctor.node import FAIL, OK, WARN, Finding, Node, load
from installer.commands.doctor.workload import (
    check_cuda,
    check_daemons,
    check_fabric,
    check_gpu_health,
    check_kernel_log,
)
from installer.settings import Settings

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
    ("daemons", check_daemons),
    ("nvlink_fabric", check_fabric),
    ("cuda", check_cuda),
    ("kernel_log", check_kernel_log),
    ("gpu_health", check_gpu_health),
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
    node = load(settings)
    findings = []
    for name, check in CHECKS:
        try:
            findings.append(check(node))
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
            findings.append(Finding(name, FAIL, f"the check itself failed: "
                                    f"{type(exc).__name__}: {exc}",
                                    "report this as an installer bug; check by hand meanwhile"))
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
