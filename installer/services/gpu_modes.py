"""What nvidia-smi says about a GPU's modes that decides what "CUDA works" means on it: MIG
mode and its MIG devices, confidential computing (CC) and its ready state, and the CUDA
processes that hold a GPU. Pure parsers, and the queries through the Runner seam.

- MIG mode is the GPU's own setting and survives reboots; its GPU and compute instances do
  not (NVIDIA MIG user guide, "Deployment Considerations"). With MIG on, CUDA enumerates MIG
  devices, never the parent GPU, and a MIG GPU without instances is no CUDA device; one CUDA
  process enumerates one MIG device at most ("CUDA Device Enumeration"). GKE's partition-gpus
  init container runs after the driver installer: it turns MIG on (``nvidia-smi -mig 1``),
  reboots an A100 node for it, and creates the instances on the next boot
  (container-engine-accelerators partition_gpu/partition_gpu.go: enableMigMode, rebootNode,
  createGPUPartitions). So a MIG GPU without instances is the partitioner's to finish.
- ``nvidia-smi --query-gpu=pci.bus_id,mig.mode.current --format=csv`` prints
  ``00000000:4F:00.0, Enabled`` (MIG user guide, "Enable MIG Mode"); ``[N/A]`` on a GPU
  without MIG. ``nvidia-smi -L`` lists each MIG device under its GPU as
  ``  MIG 1g.10gb     Device  0: (UUID: MIG-a686709d-6dc2-542a-8851-0d2508448c10)``.
- CC: ``nvidia-smi conf-compute -f`` prints ``CC status: ON``; ``-grs`` prints
  ``Confidential Compute GPUs Ready state: ready`` (or ``not-ready``); CUDA fails with
  "system not yet initialized" (802) until ``-srs 1`` (NVIDIA GPU operator, confidential
  containers guide, "Viewing the GPU Ready State").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import structlog

from installer.base.dataclass import dataclass
from installer.host.runner import CommandError, Runner

log = structlog.get_logger(__name__)

SMI_TIMEOUT_S = 60
INFOROM_CORRUPTED = 14  # nvidia-smi(1), RETURN VALUE: its rows are still printed
MIG_QUERY = "--query-gpu=pci.bus_id,uuid,mig.mode.current"
APPS_QUERY = "--query-compute-apps=pid,process_name,gpu_bus_id"
_GPU_LINE = re.compile(r"^GPU \d+: .*\(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[0-9a-fA-F-]+)\)\s*$")


@dataclass(frozen=True)
class GpuMode:
    address: str  # sysfs form, 0000:00:04.0
    uuid: str
    mig: bool


@dataclass(frozen=True)
class MigDevice:
    profile: str  # 1g.10gb
    uuid: str  # MIG-...


def sysfs_address(bus_id: str) -> str:
    """nvidia-smi's ``00000000:00:04.0`` as sysfs names it, ``0000:00:04.0``."""
    domain, sep, rest = bus_id.strip().partition(":")
    return f"{domain[-4:]}:{rest}".lower() if sep else bus_id.strip().lower()


def parse_modes(text: str) -> dict[str, GpuMode]:
    """``pci.bus_id, uuid, mig.mode.current`` rows (csv,noheader) by sysfs address."""
    out = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[1].startswith("GPU-"):
            addr = sysfs_address(parts[0])
            out[addr] = GpuMode(addr, parts[1], parts[2] == "Enabled")
    return out


def parse_mig_list(text: str) -> dict[str, list[MigDevice]]:
    """``nvidia-smi -L``: each GPU's UUID -> its MIG devices, in the listed order."""
    out: dict[str, list[MigDevice]] = {}
    current = None
    for line in text.splitlines():
        if m := _GPU_LINE.match(line):
            current = m.group(1)
            out.setdefault(current, [])
        elif (m := _MIG_LINE.match(line)) and current is not None:
            out[current].append(MigDevice(m.group(1), m.group(3)))
    return out


def parse_apps(text: str) -> dict[str, list[str]]:
    """``pid, process_name, gpu_bus_id`` rows: sysfs address -> ``name (pid N)`` each."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            out.setdefault(sysfs_address(parts[2]), []).append(f"{parts[1]} (pid {parts[0]})")
    return out


def cc_on(text: str) -> bool:
    return any(line.strip() == "CC status: ON" for line in text.splitlines())


def cc_ready(text: str) -> bool:
    return any(line.strip().endswith("Ready state: ready") for line in text.splitlines())


def _smi(runner: Runner, smi: Path, args: list[str], env: Mapping[str, str]) -> str | None:
    """nvidia-smi's stdout; an infoROM warning (exit 14) still gives its rows; None when it
    failed otherwise (the caller's check then decides without it)."""
    try:
        return runner.run([smi, *args], timeout=SMI_TIMEOUT_S, env=dict(env)).stdout
    except CommandError as exc:
        if exc.returncode == INFOROM_CORRUPTED:
            return exc.stdout
        log.info("nvidia_smi_query_failed", args=args, reason=exc.reason)
        return None


def query_modes(runner: Runner, smi: Path, env: Mapping[str, str]) -> dict[str, GpuMode]:
    return parse_modes(_smi(runner, smi, [MIG_QUERY, "--format=csv,noheader"], env) or "")


def query_mig_devices(runner: Runner, smi: Path,
                      env: Mapping[str, str]) -> dict[str, list[MigDevice]]:
    return parse_mig_list(_smi(runner, smi, ["-L"], env) or "")


def query_apps(runner: Runner, smi: Path, env: Mapping[str, str]) -> dict[str, list[str]]:
    return parse_apps(_smi(runner, smi, [APPS_QUERY, "--format=csv,noheader"], env) or "")


def query_cc(runner: Runner, smi: Path, env: Mapping[str, str]) -> tuple[bool, bool]:
    """(CC on, GPUs ready state set)."""
    status = _smi(runner, smi, ["conf-compute", "-f"], env) or ""
    if not cc_on(status):
        return False, False
    return True, cc_ready(_smi(runner, smi, ["conf-compute", "-grs"], env) or "")
