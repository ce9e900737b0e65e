"""NVSwitch systems: is there a fabric, and has the fabric manager finished it.

On an NVSwitch system (HGX H100/H200/B200) nvidia-smi is green while every CUDA program
fails with 802 (CUDA_ERROR_SYSTEM_NOT_READY) until NVIDIA's fabric manager has trained the
NVLink fabric and each GPU's ``fabric.state`` is ``Completed`` (cuda_check.FAILURES[802]).

- Told by the hardware: NVSwitch functions on the PCI bus (vendor 0x10de, class 0x0680xx,
  "bridge, other") and the ``/dev/nvidia-nvswitch*`` files. Never by /proc/devices: every
  545+ driver registers ``nvidia-nvswitch`` there, also on a real H100 node without one
  (shared/reference/gpu-node/README.md, "CUDA errors and the fabric").
- ``nvidia-smi --query-gpu=pci.bus_id,fabric.state,fabric.status`` prints ``N/A`` for both
  fields where there is no fabric (the same node): that is "no fabric", never "not ready".
- The gate waits, under a deadline, for every GPU's state ``Completed`` with status
  ``Success``; it fails at once with the cause when the fabric manager's sidecar reports it
  died (daemons.py writes its state), and at the deadline naming what it last saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from installer import gpus
from installer.errors import VerifyError

log = structlog.get_logger(__name__)

NVSWITCH_CLASS_PREFIX = "0x0680"
NOT_APPLICABLE = "N/A"
COMPLETED, SUCCESS = "Completed", "Success"
FABRIC_QUERY = "--query-gpu=pci.bus_id,fabric.state,fabric.status"
DEFAULT_DEADLINE_S = 600.0  # fabric training takes up to minutes on an 8-GPU HGX board
POLL_S = 2.0


def nvswitches(sys_dir: Path) -> list[str]:
    """PCI addresses of the NVSwitch functions under ``<sys_dir>/bus/pci/devices``."""
    return [dev.name for dev, _class in gpus.nvidia_functions(sys_dir, NVSWITCH_CLASS_PREFIX)]


def nvswitch_device_files(dev_dir: Path) -> list[str]:
    """The ``/dev/nvidia-nvswitch*`` files (``nvidia-nvswitchctl``, ``nvidia-nvswitch<N>``)."""
    try:
        return sorted(p.name for p in Path(dev_dir).glob("nvidia-nvswitch*"))
    except OSError:
        return []


@dataclass(frozen=True)
class GpuFabric:
    bus_id: str
    state: str
    status: str

    @property
    def done(self) -> bool:
        return self.state == COMPLETED and self.status == SUCCESS

    @property
    def failed(self) -> bool:
        """Completed with an error status: the fabric manager gave up on this GPU."""
        return self.state == COMPLETED and self.status not in (SUCCESS, NOT_APPLICABLE)

    def describe(self) -> str:
        return f"{self.bus_id} {self.state}/{self.status}"


def parse(text: str) -> list[GpuFabric]:
    """``nvidia-smi --query-gpu=pci.bus_id,fabric.state,fabric.status --format=csv,noheader``."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0]:
            rows.append(GpuFabric(*parts))
    return rows


def has_fabric(rows: list[GpuFabric]) -> bool:
    """False when nvidia-smi says ``N/A`` for every GPU's state: no fabric on this node."""
    return any(r.state not in (NOT_APPLICABLE, "[N/A]", "Not Supported") for r in rows)


@dataclass(frozen=True)
class Gate:
    """What the fabric gate reads: the GPUs' fabric (nvidia-smi) and the fabric manager's
    own state (None: running or not yet started; else why it is not running)."""

    query: Callable[[], list[GpuFabric]]
    manager_down: Callable[[], str | None]
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def wait_completed(gate: Gate, deadline_s: float) -> list[GpuFabric]:
    """Every GPU's fabric Completed/Success within ``deadline_s``, or VerifyError (exit 9)
    naming the cause: the fabric manager's death, a GPU the fabric manager failed, or the
    states it last saw at the deadline."""
    end = gate.clock() + deadline_s
    rows: list[GpuFabric] = []
    while True:
        rows = gate.query()
        failed = [r for r in rows if r.failed]
        if failed:
            raise VerifyError(
                "NVLink fabric failed on " + ", ".join(r.describe() for r in failed),
                hint="read the fabric manager's log (the fabric-manager sidecar's output); "
                "a GPU or NVSwitch that fails training needs a reset or a reboot")
        if rows and all(r.done for r in rows):
            log.info("fabric_completed", gpus=len(rows))
            return rows
        down = gate.manager_down()
        if down is not None:
            raise VerifyError(f"NVLink fabric not ready and the fabric manager is not "
                              f"running: {down}", hint=MANAGER_HINT)
        if gate.clock() >= end:
            seen = ", ".join(r.describe() for r in rows) or "no GPU answered"
            raise VerifyError(f"NVLink fabric not Completed within {deadline_s:g}s: {seen}",
                              hint=MANAGER_HINT)
        gate.sleep(POLL_S)


MANAGER_HINT = ("run NVIDIA's fabric manager for exactly this driver version: the fabric-"
                "manager sidecar of `manifests render --nvswitch` (nvidia-driver-installer "
                "fabric-manager), and read its output")
