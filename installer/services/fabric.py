"""NVLink fabrics: which kind this node has, and when the fabric manager has finished it.

On an NVSwitch system nvidia-smi is green while every CUDA program fails with 802
(CUDA_ERROR_SYSTEM_NOT_READY) until NVIDIA's fabric manager has trained the NVLink fabric
(cuda_check.FAILURES[802]). What "finished" looks like depends on the generation:

- **NVSwitch gen 2, HGX A100** (``lr10``) and **gen 3, HGX H100/H200** (``ls10``): the
  switches are PCI functions of the host, vendor 0x10de, class 0x068000 (the class the
  driver's own NVSwitch driver binds: open-gpu-kernel-modules kernel-open/nvidia/
  linux_nvswitch.c ``nvswitch_pci_table``); the device id tells the generation
  (src/common/nvswitch/kernel/nvswitch.c ``nvswitch_lr10_device_ids`` /
  ``nvswitch_ls10_device_ids``, the ids ``nvswitch_is_lr10_device_id`` /
  ``nvswitch_is_ls10_device_id`` test). Never told by /proc/devices: every 545+ driver
  registers ``nvidia-nvswitch`` there, also on a real H100 node without one
  (docs/nvidia-facts.md, "CUDA and the fabric on a real H100 node").
- **NVLink5, HGX B200/GB200**: the switches are no PCI functions of the host (the host's
  NVSwitch driver knows only lr10 and ls10: nvswitch.c's two id tables); NVIDIA's
  driver container recognises the system by an InfiniBand device whose VPD holds ``SW_MNG``
  (NVIDIA/gpu-driver-container ubuntu24.04/nvidia-driver ``_assert_nvlink5_system``: grep
  of ``/sys/class/infiniband/*/device/vpd``), and starts the fabric manager together with
  NVIDIA's NVLink subnet manager ``nvlsm`` (``_start_daemons``,
  ``nvidia-fabricmanager-start.sh``), after ``mlx5_core`` and ``ib_umad`` are loaded
  (``_ensure_nvlink5_prerequisites``).

The gate, by kind, always under ``--fabric-deadline`` and failing at once with the cause when
the fabric manager's sidecar reports it died (services/supervise.py writes its state):

- gen 3 and NVLink5: NVML's GPU fabric info (``nvmlDeviceGetGpuFabricInfo``, Hopper or
  newer; nvidia-smi ``fabric.state``/``fabric.status``) reaches ``Completed``/``Success``.
- gen 2: that info reads ``N/A`` on Ampere GPUs even with a healthy fabric manager (its
  ``nvmlDeviceGetGpuFabricInfo`` is Hopper-or-newer), so the gate is the fabric manager's
  own state and CUDA: cuInit's 802 retried until it is gone.
- an NVSwitch of an id neither table lists: by what NVML says (``has_fabric``): a state is
  waited for, ``N/A`` is gated as gen 2.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import structlog

from installer.base.dataclass import dataclass
from installer.base.errors import VerifyError
from installer.base.fsutil import sorted_entries
from installer.host import gpus

log = structlog.get_logger(__name__)

NVSWITCH_CLASS_PREFIX = "0x0680"
NOT_APPLICABLE = "N/A"
COMPLETED, SUCCESS = "Completed", "Success"
FABRIC_QUERY = "--query-gpu=pci.bus_id,fabric.state,fabric.status"
DEFAULT_DEADLINE_S = 600.0  # fabric training takes up to minutes on an 8-GPU HGX board
POLL_S = 2.0
SYSTEM_NOT_READY = 802  # cuda.h CUDA_ERROR_SYSTEM_NOT_READY

# open-gpu-kernel-modules src/common/nvswitch/kernel/nvswitch.c: nvswitch_lr10_device_ids
# (gen 2, HGX A100) and nvswitch_ls10_device_ids (gen 3, HGX H100/H200; 0x22A0-0x22A7 the
# PCIe endpoints that manage the switch, 0x22A8-0x22AF its bridge functions).
LR10_DEVICE_IDS = frozenset(["0x1ae8", *(f"0x{i:04x}" for i in range(0x1AF0, 0x1B00))])
LS10_DEVICE_IDS = frozenset(f"0x{i:04x}" for i in range(0x22A0, 0x22B0))
NONE, GEN2, GEN3, NVLINK5, UNKNOWN_GEN = (
    "none", "nvswitch-gen2", "nvswitch-gen3", "nvlink5", "nvswitch")
KIND_NAMES = {GEN2: "NVSwitch gen 2 (lr10, HGX A100)", GEN3: "NVSwitch gen 3 (ls10, HGX "
              "H100/H200)", NVLINK5: "NVLink5 (HGX B200/GB200: an InfiniBand device whose "
              "VPD holds SW_MNG)", UNKNOWN_GEN: "NVSwitch of an unknown generation",
              NONE: "no NVLink fabric"}
NVLINK5_VPD_MARK = b"SW_MNG"
VPD_MAX_BYTES = 1 << 16  # PCI VPD is at most 32 KiB (15-bit address): read no more


def nvswitches(sys_dir: Path) -> list[str]:
    """PCI addresses of the NVSwitch functions under ``<sys_dir>/bus/pci/devices``."""
    return [dev.name for dev, _class in gpus.nvidia_functions(sys_dir, NVSWITCH_CLASS_PREFIX)]


def nvlink5_bridges(sys_dir: Path) -> list[str]:
    """InfiniBand devices (``/sys/class/infiniband/<dev>``) whose PCI function's VPD holds
    ``SW_MNG``: NVIDIA's test for an NVLink5 system (gpu-driver-container
    ``_assert_nvlink5_system``)."""
    found = []
    for dev in sorted_entries(Path(sys_dir) / "class/infiniband"):
        try:
            with (dev / "device/vpd").open("rb") as f:
                vpd = f.read(VPD_MAX_BYTES)
        except OSError:
            continue
        if NVLINK5_VPD_MARK in vpd:
            found.append(dev.name)
    return found


@dataclass(frozen=True)
class Fabric:
    """The node's NVLink fabric: its kind and what shows it (switch PCI addresses, or the
    InfiniBand devices of an NVLink5 system)."""

    kind: str
    devices: tuple[str, ...] = ()

    @property
    def present(self) -> bool:
        return self.kind != NONE

    def describe(self) -> str:
        shown = f": {', '.join(self.devices)}" if self.devices else ""
        return f"{KIND_NAMES[self.kind]}{shown}"


def detect(sys_dir: Path) -> Fabric:
    """The fabric as NVIDIA tells it: NVLink5 first (as gpu-driver-container's
    ``_start_daemons`` tries ``_assert_nvlink5_system`` before ``_assert_nvswitch_system``),
    then the NVSwitch functions on the PCI bus by their device id."""
    bridges = nvlink5_bridges(sys_dir)
    if bridges:
        return Fabric(NVLINK5, tuple(bridges))
    found = gpus.nvidia_functions(sys_dir, NVSWITCH_CLASS_PREFIX)
    if not found:
        return Fabric(NONE)
    ids = {gpus.read_attr(dev / "device") for dev, _class in found}
    kind = GEN2 if ids <= LR10_DEVICE_IDS else GEN3 if ids <= LS10_DEVICE_IDS else UNKNOWN_GEN
    return Fabric(kind, tuple(dev.name for dev, _class in found))


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
    """False when nvidia-smi says ``N/A`` for every GPU's state: NVML keeps no fabric state
    for these GPUs (no fabric, or Ampere GPUs, whose fabric info is not supported)."""
    return any(r.state not in (NOT_APPLICABLE, "[N/A]", "Not Supported", "[Not Supported]")
               for r in rows)


@dataclass(frozen=True)
class Gate:
    """What the fabric gate reads: the GPUs' fabric (nvidia-smi), the fabric manager's own
    state (``manager_down``: None while running or not yet started, else why it is not
    running; ``manager_state``: its state word, None where no sidecar reports), and, for
    the gen-2 gate, cuInit's result (``cuda_init``: None when CUDA works, 802 while the
    system is not ready; any other failure raises)."""

    query: Callable[[], list[GpuFabric]]
    manager_down: Callable[[], str | None]
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    cuda_init: Callable[[], int | None] | None = None
    manager_state: Callable[[], str | None] = lambda: None


def state_gated(fabric: Fabric, rows: list[GpuFabric]) -> bool:
    """Whether NVML's fabric state tells this fabric's readiness: gen 3 and NVLink5 yes,
    gen 2 (Ampere: N/A) no, an NVSwitch of unknown generation by what NVML said
    (``has_fabric``)."""
    if fabric.kind == UNKNOWN_GEN:
        return has_fabric(rows)
    return fabric.kind in (GEN3, NVLINK5)


def wait_ready(gate: Gate, fabric: Fabric, deadline_s: float) -> str:
    """The gate of ``fabric``'s kind (module docstring); what it proved: ``completed``
    (every GPU's fabric state) or ``cuda`` (cuInit past 802). VerifyError (exit 9) naming the
    cause otherwise."""
    rows = gate.query() if fabric.kind == UNKNOWN_GEN else []
    if not state_gated(fabric, rows):
        wait_cuda_ready(gate, fabric, deadline_s)
        return "cuda"
    wait_completed(gate, deadline_s)
    return "completed"


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
        _manager_alive(gate)
        if gate.clock() >= end:
            seen = ", ".join(r.describe() for r in rows) or "no GPU answered"
            raise VerifyError(f"NVLink fabric not Completed within {deadline_s:g}s: {seen}",
                              hint=MANAGER_HINT)
        gate.sleep(POLL_S)


def wait_cuda_ready(gate: Gate, fabric: Fabric, deadline_s: float) -> None:
    """NVSwitch gen 2 (HGX A100): NVML has no fabric state on Ampere, so the fabric is
    ready when cuInit stops answering 802, tried every POLL_S within ``deadline_s``; a dead
    fabric manager ends it at once. Without ``cuda_init`` (--skip-cuda-check) the fabric
    manager's sidecar running is all that can be waited for."""
    end = gate.clock() + deadline_s
    while True:
        _manager_alive(gate)
        state = gate.manager_state()
        if gate.cuda_init is None:
            if state == "running":
                log.warning("fabric_not_proven", fabric=fabric.kind, manager=state,
                            risk="the CUDA check is skipped: nothing proves the fabric trained")
                return
        elif gate.cuda_init() is None:
            log.info("fabric_cuda_ready", fabric=fabric.kind, manager=state)
            return
        if gate.clock() >= end:
            manager = (f"the fabric manager's sidecar is {state}" if state else
                       "no fabric manager reports on this node")
            cuda = (f"CUDA still returns {SYSTEM_NOT_READY} (system not ready)" if gate.cuda_init
                    else "the CUDA check is skipped")
            raise VerifyError(
                f"NVLink fabric ({KIND_NAMES[fabric.kind]}) not ready within {deadline_s:g}s: "
                f"{cuda} and {manager}; "
                "these GPUs keep no fabric state (N/A), only the fabric manager trains it",
                hint=MANAGER_HINT)
        gate.sleep(POLL_S)


def _manager_alive(gate: Gate) -> None:
    down = gate.manager_down()
    if down is not None:
        raise VerifyError(f"NVLink fabric not ready and the fabric manager is not "
                          f"running: {down}", hint=MANAGER_HINT)


MANAGER_HINT = ("run NVIDIA's fabric manager for exactly this driver version: the fabric-"
                "manager sidecar of `manifests render --nvswitch` (nvidia-driver-installer "
                "sidecar fabric-manager), and read its output")
