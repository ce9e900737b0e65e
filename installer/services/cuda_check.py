"""Proof a CUDA program will run: the driver API on every GPU, in a child with a deadline.

nvidia-smi (NVML) can be green while every CUDA program fails: on NVSwitch systems cuInit
returns 802 until the fabric manager has trained the fabric; without the UVM device files it
returns 999 (a real H100 node: docs/nvidia-facts.md, "CUDA and the fabric on a real H100
node"). So ``verify`` and every install's verify step also load the install dir's own
``libcuda.so.1`` in a child process (``cuda_probe.py``) and make a context and a small memory
round trip on each GPU. The child runs in its own process group under a deadline: a cuInit
hung on a wedged GPU is killed, the installer is not.

Node shapes (docs/node-shapes.md): GPUs in MIG mode are counted apart (gpu_modes.py). The
GPUs not in MIG mode are probed together (CUDA_VISIBLE_DEVICES=<their GPU UUIDs>), each MIG
device that exists alone (CUDA_VISIBLE_DEVICES=MIG-<uuid>: one CUDA process enumerates one MIG
device at most); a MIG GPU without instances is no CUDA device, so its proof is deferred to
the partitioner (GKE's partition-gpus runs after this container) and a later verify/doctor.
A GPU bound to vfio-pci is not the driver's (gpus.PciGpu.driver). A GPU whose context or 1 MiB
fails with 46 (busy: exclusive-process) or 2 (memory full) while nvidia-smi shows CUDA
processes on it is busy, not broken: cuInit already succeeded in our child, and a CUDA process
running there is proof a CUDA program runs on this driver; failing the pod would take a
working node's GPUs away on every rerun. With no process shown, it fails as before.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from installer.base.dataclass import dataclass
from installer.base.errors import VerifyError
from installer.host import gpus
from installer.host.runner import CommandError, Runner, tail
from installer.jail.visible import visible as escaped  # `visible`: CUDA_VISIBLE_DEVICES' values
from installer.kmod.kernel import KernelState
from installer.services import cuda_probe, gpu_modes

log = structlog.get_logger(__name__)

DEFAULT_DEADLINE_S = 60.0  # the whole check took 0.29-0.41 s on a real H100
ROUND_TRIP_BYTES = 1 << 20
LIBCUDA = "libcuda.so.1"
SKIP_HINT = ("--skip-cuda-check (NVIDIA_SKIP_CUDA_CHECK=true) skips this check where no CUDA "
             "context may be made; then nothing proves a CUDA program will run")


@dataclass(frozen=True)
class CudaFailure:
    name: str  # cuda.h's enum name
    cause: str
    fix: str


# cuda.h's CUresult values, each with what it means on a node we just installed. The states
# that produce 100 and 999 were reproduced on a real H100 (gpu-node/README.md, the table).
FAILURES = {
    100: CudaFailure(
        "CUDA_ERROR_NO_DEVICE", "CUDA sees no GPU",
        "check /dev/nvidiactl and /dev/nvidia<N> exist and this process may open them "
        "(mode 0666, a privileged container or a device cgroup allowing them) and that "
        "CUDA_VISIBLE_DEVICES does not hide the GPUs"),
    999: CudaFailure(
        "CUDA_ERROR_UNKNOWN", "CUDA cannot use the unified memory driver",
        "check nvidia_uvm is loaded and /dev/nvidia-uvm and /dev/nvidia-uvm-tools exist with "
        "the nvidia-uvm major of /proc/devices (re-run install to make them)"),
    3: CudaFailure(
        "CUDA_ERROR_NOT_INITIALIZED", "the CUDA driver did not initialise",
        "read the kernel log for NVRM errors and re-run install; a GPU that stays so needs a "
        "reset or a reboot"),
    802: CudaFailure(
        "CUDA_ERROR_SYSTEM_NOT_READY",
        "the system is not ready: on an NVSwitch or NVLink5 system the fabric manager has not "
        "finished the NVLink fabric",
        "run nvidia-fabricmanager of exactly this driver version (the fabric-manager sidecar, "
        "manifests render --nvswitch) and let it train the fabric; where doctor's "
        "nvlink_fabric line finds no fabric that sidecar idles and cannot help: read the "
        "kernel log for NVRM lines"),
    803: CudaFailure(
        "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        "the loaded kernel module is another driver version than this libcuda",
        "drain the node and re-run install to load the matching module, or reboot"),
    804: CudaFailure(
        "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        "a CUDA forward-compatibility libcuda is in use on a GPU that does not support it",
        "take the cuda-compat libcuda off LD_LIBRARY_PATH and the ld cache so the driver's "
        "own libcuda.so.1 is used"),
    46: CudaFailure(
        "CUDA_ERROR_DEVICES_UNAVAILABLE",
        "the GPU is in exclusive-process or prohibited compute mode and is taken",
        "wait for the process holding it, or set the compute mode back "
        "(nvidia-smi -c DEFAULT)"),
    2: CudaFailure(
        "CUDA_ERROR_OUT_OF_MEMORY",
        "the GPU has no memory left for a context and a 1 MiB buffer: it is in use",
        "find the processes on it (nvidia-smi) and drain the node's GPU workloads"),
}


BUSY_CODES = frozenset({46, 2})  # CUDA_ERROR_DEVICES_UNAVAILABLE, CUDA_ERROR_OUT_OF_MEMORY


@dataclass(frozen=True)
class CudaResult:
    count: int
    devices: list[dict[str, object]]
    cuda_driver_version: int | None
    total_s: float
    mig_devices: int = 0  # of ``count``: MIG devices, each proven in a child of its own
    deferred: tuple[str, ...] = ()  # "MIG mode on GPU X, no instances yet"
    busy: tuple[str, ...] = ()  # GPUs held by other CUDA processes (not a failure)

    def summary(self) -> str:
        """The one-line outcome for driver-ready's CUDA_CHECK and status.json."""
        notes = [f"busy: {b}" for b in self.busy]
        if self.deferred:
            return "; ".join([f"deferred: {d}" for d in self.deferred] + notes)
        return "; ".join(["passed", *notes])

    def describe(self) -> str:
        mig = f" ({self.mig_devices} MIG device(s))" if self.mig_devices else ""
        return "; ".join([f"{self.count} device(s){mig}: a context and a memory round trip "
                          f"each, {self.total_s:.2f}s", *[f"deferred: {d}" for d in self.deferred],
                          *[f"busy: {b}" for b in self.busy]])


def expected_gpus(kernel: KernelState, on_bus: Sequence[gpus.PciGpu]) -> list[str]:
    """PCI addresses of the NVIDIA GPUs CUDA must see: those on the bus (``on_bus``, the
    run's one scan: Context.pci_gpus) that the driver did not exclude (NVreg_ExcludedGpus:
    ``GPU Excluded: Yes`` in /proc/driver/nvidia/gpus/<bus>/information,
    open-gpu-kernel-modules nv-procfs.c; the real node's file says ``GPU Excluded:\t No``),
    nor bound to another driver (vfio-pci: passed through to a VM, CUDA here never sees it)."""
    wanted = []
    for gpu in on_bus:
        if gpus.bound_elsewhere(gpu):
            log.info("cuda_check_gpu_not_ours", gpu=gpu.address, driver=gpu.driver)
            continue
        info = kernel.proc_dir / "driver/nvidia/gpus" / gpu.address / "information"
        try:
            text = info.read_text(errors="replace")
        except OSError:
            text = ""
        excluded = any(line.split(":", 1)[0].strip() == "GPU Excluded"
                       and line.split(":", 1)[1].strip() == "Yes"
                       for line in text.splitlines() if ":" in line)
        if not excluded:
            wanted.append(gpu.address)
    return wanted


def explain(call: str, rc: int | None, name: str = "") -> tuple[str, str]:
    """The one-line message and the fix for a CUDA call's error code."""
    known = FAILURES.get(rc) if rc is not None else None
    if known is None:
        code = f"{rc} {name}".strip() if rc is not None else "no result"
        return (f"CUDA check: {call} failed ({code})",
                "run `nvidia-driver-installer doctor` and read the kernel log for NVIDIA Xid "
                f"lines; {SKIP_HINT}")
    return f"CUDA check: {call} returned {rc} {known.name}: {known.cause}", known.fix


def probe_argv(libcuda: Path) -> list[str]:
    """The probe in a pid namespace of its own, its output bounded (cuda_probe.bounded):
    killed with the Runner's process group, it takes every child with it."""
    return ["unshare", "--pid", "--fork", "--kill-child", "--", sys.executable, "-I",
            cuda_probe.__file__, "--bounded", str(libcuda), str(ROUND_TRIP_BYTES)]


def checked_file(lib64: Path) -> Path:
    """The file ``libcuda.so.1`` leads to (a name beside it, one link at most): the file
    whose digest the install's record holds (cache.LOADER_LINKS), which the probe loads by
    its own path; VerifyError when the link leads anywhere else."""
    libcuda = lib64 / LIBCUDA
    if not libcuda.is_symlink():
        return libcuda
    target = os.readlink(libcuda)
    real = lib64 / target
    if "/" in target or real.is_symlink() or not real.is_file():
        raise VerifyError(f"CUDA check: {libcuda} leads to {escaped(target)!r}, not to a "
                          "file beside it", path=str(libcuda),
                          hint="re-run install to put the driver's libraries back")
    return real


def check(lib64: Path, kernel: KernelState, runner: Runner, on_bus: Sequence[gpus.PciGpu], *,
          deadline_s: float = DEFAULT_DEADLINE_S) -> CudaResult:
    """cuInit, the device count, a context and a memory round trip per CUDA device (each
    GPU not in MIG mode, each MIG device); VerifyError (exit 9) with the cause and its fix,
    else what CUDA saw, with the MIG GPUs whose proof waits for their instances."""
    libcuda = lib64 / LIBCUDA
    if not libcuda.exists():
        raise VerifyError(f"CUDA check: {libcuda} is missing", path=str(libcuda),
                          hint="re-run install to put the driver's libraries back")
    probe = _Probe(checked_file(lib64), runner, deadline_s, lib64.parent / "bin/nvidia-smi",
                   {"LD_LIBRARY_PATH": str(lib64)})
    expected = expected_gpus(kernel, on_bus)
    modes = gpu_modes.query_modes(runner, probe.smi, probe.smi_env)
    in_mig = [a for a in expected if a in modes and modes[a].mig]
    if not in_mig:
        return probe.prove(None, expected)
    listed = gpu_modes.query_mig_devices(runner, probe.smi, probe.smi_env)
    plain = [a for a in expected if a not in in_mig]
    parts = [probe.prove([modes[a].uuid for a in plain], plain)] if plain else []
    deferred = []
    for address in in_mig:
        instances = listed.get(modes[address].uuid, [])
        if not instances:
            deferred.append(f"MIG mode on GPU {address}, no instances yet")
        parts += [probe.prove([mig.uuid], [address]) for mig in instances]
    mig_count = sum(len(listed.get(modes[a].uuid, [])) for a in in_mig)
    result = CudaResult(
        sum(p.count for p in parts), [d for p in parts for d in p.devices],
        next((p.cuda_driver_version for p in parts), None),
        round(sum(p.total_s for p in parts), 3), mig_count, tuple(deferred),
        tuple(b for p in parts for b in p.busy))
    if deferred:
        log.warning("cuda_check_deferred", deferred=list(deferred),
                    why="a GPU in MIG mode without instances is no CUDA device; the MIG "
                    "partitioner makes them after this container",
                    then="verify or doctor proves CUDA on each instance once they exist")
    return result


@dataclass(frozen=True)
class _Probe:
    libcuda: Path
    runner: Runner
    deadline_s: float
    smi: Path
    smi_env: dict[str, str]

    def child(self, visible: str | None) -> dict[str, Any]:
        """One run of cuda_probe.py (CUDA_VISIBLE_DEVICES=``visible`` when given)."""
        argv = probe_argv(self.libcuda)
        env = {"CUDA_VISIBLE_DEVICES": visible} if visible is not None else None
        try:
            res = self.runner.run(argv, timeout=self.deadline_s, env=env)
            doc: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
            return doc
        except CommandError as exc:
            if exc.reason.startswith("timed out"):  # Runner stopped its process group
                raise VerifyError(
                    f"CUDA check: no answer from libcuda within {self.deadline_s:g}s (cuInit "
                    "or a context hangs), the check was stopped",
                    hint="a hung GPU needs a reset or a reboot: run `nvidia-driver-installer "
                    "doctor` for Xid lines in the kernel log", path=str(self.libcuda)) from exc
            said = " | ".join(escaped(ln)
                              for ln in tail(exc.stdout + exc.stderr, 2).splitlines())
            raise VerifyError(f"CUDA check: the child died ({exc.reason}): "
                              f"{said or '(no output)'}", path=str(self.libcuda),
                              hint="read the kernel log for NVIDIA Xid lines") from exc
        except (IndexError, ValueError, AttributeError) as exc:
            raise VerifyError("CUDA check: the child printed no result", path=str(self.libcuda),
                              hint="read the kernel log for NVIDIA Xid lines") from exc

    def prove(self, ids: list[str] | None, expected: list[str]) -> CudaResult:
        """The devices ``ids`` name (None: CUDA's own enumeration) against ``expected``; a
        busy device is noted and the check goes on with the ones after it."""
        if not expected:  # no GPU to see: CUDA must agree (cuInit says 100 otherwise)
            return judge(self.child(None if ids is None else ""), [])
        busy: list[str] = []
        devices: list[dict[str, object]] = []
        start, first = 0, None
        while start < len(expected):
            names = ids if ids is not None else [str(i) for i in range(len(expected))]
            visible = None if ids is None and start == 0 else ",".join(names[start:])
            doc = self.child(visible)
            try:
                done = judge(doc, expected[start:])
            except VerifyError as exc:
                held = self.held(doc)
                if held is None:
                    if (cc := self.cc_not_ready(doc)) is not None:
                        raise cc from exc
                    raise
                busy.append(held)
                start += max(1, len(doc.get("devices") or []))
                continue
            first = first or done
            devices += done.devices
            break
        total = len(devices) + len(busy)
        return CudaResult(total, devices, first.cuda_driver_version if first else None,
                          first.total_s if first else 0.0, busy=tuple(busy))

    def cc_not_ready(self, doc: dict[str, Any]) -> VerifyError | None:
        """802 with confidential computing on and its ready state not set: that, not the
        fabric manager, is what CUDA waits for."""
        error = doc.get("error") or {}
        if error.get("rc") != 802:
            return None
        on, ready = gpu_modes.query_cc(self.runner, self.smi, self.smi_env)
        if not on or ready:
            return None
        return VerifyError(
            "CUDA check: cuInit returned 802 CUDA_ERROR_SYSTEM_NOT_READY: confidential "
            "computing is on (nvidia-smi conf-compute -f: CC status: ON) and the GPUs' ready "
            "state is not-ready, so CUDA refuses work", cuda_error=error,
            hint="attest the GPUs, then set the ready state: re-run with --cc-set-ready "
            "(NVIDIA_CC_SET_READY=true; it runs `nvidia-smi conf-compute -srs 1` after "
            "persistenced), or run that command yourself; the fabric manager is not involved")

    def held(self, doc: dict[str, Any]) -> str | None:
        """"<bus>: held by <processes>" when CUDA failed on a device (46 or 2) that other
        CUDA processes hold, per nvidia-smi; None: a failure to report."""
        error = doc.get("error") or {}
        devices = doc.get("devices") or []
        if error.get("rc") not in BUSY_CODES or not devices:
            return None
        bus = str(devices[-1].get("bus_id") or "")
        holders = gpu_modes.query_apps(self.runner, self.smi, self.smi_env).get(
            gpu_modes.sysfs_address(bus), [])
        if not holders:
            return None
        note = (f"GPU {gpu_modes.sysfs_address(bus)} held by {', '.join(holders)} "
                f"({error.get('call')} returned {error.get('rc')})")
        log.warning("cuda_check_gpu_busy", gpu=bus, processes=holders, cuda_error=error,
                    why="another CUDA process runs there: CUDA works on this GPU")
        return note


def judge(doc: dict[str, Any], expected: list[str]) -> CudaResult:
    """Read the child's JSON line: its error, the device count against the GPUs the PCI bus
    has, every round trip."""
    error = doc.get("error")
    if isinstance(error, dict) and error.get("rc") is None and error.get("text"):
        raise VerifyError(f"CUDA check: {escaped(str(error.get('call')))} failed: "
                          f"{escaped(str(error['text']))}", cuda_error=error,
                          hint="the install's libcuda.so.1 cannot be loaded as it is: "
                          "re-run install to put the driver's libraries back")
    if isinstance(error, dict):
        message, fix = explain(str(error.get("call")), error.get("rc"), str(error.get("name", "")))
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
        if error.get("rc") == 100 and hidden is not None:
            message += f" (CUDA_VISIBLE_DEVICES={hidden!r} is set here)"
        raise VerifyError(message, hint=fix, cuda_error=error)
    count, devices = doc.get("count"), doc.get("devices") or []
    if count != len(expected):
        raise VerifyError(
            f"CUDA check: CUDA sees {count} GPU(s), the PCI bus has {len(expected)} the driver "
            f"did not exclude ({', '.join(expected) or 'none'})",
            hint="a GPU CUDA cannot see: check its /dev/nvidia<N> file, CUDA_VISIBLE_DEVICES, "
            "and the kernel log for NVRM errors about it")
    wrong = [d for d in devices if not d.get("roundtrip_ok")]
    if wrong:
        raise VerifyError(
            f"CUDA check: memory written on GPU {wrong[0].get('index')} "
            f"({wrong[0].get('bus_id')}) read back different",
            hint="the GPU's memory is not trustworthy: drain the node and reset the GPU; "
            "doctor shows the Xid lines")
    result = CudaResult(count, devices, doc.get("cuda_driver_version"),
                        float(doc.get("total_s") or 0.0))
    log.info("cuda_check_ok", gpus=count, cuda_driver_version=result.cuda_driver_version,
             total_s=result.total_s)
    return result
