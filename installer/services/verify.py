"""Proof the driver works: device nodes, nvidia-smi, and what a workload needs:
the NVLink fabric where there is one, CUDA itself, the daemon sidecars."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from installer.base.dataclass import dataclass
from installer.base.errors import VerifyError
from installer.host.gpus import Gpu
from installer.host.installdir import Tree
from installer.host.runner import CommandError, Runner
from installer.services import cuda_check, fabric, gpu_modes
from installer.services import supervise as daemons

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)

SMI_TIMEOUT_S = 120
DAEMON_DEADLINE_S = 120  # a sidecar polls every 5 s once the driver and its files are there


def parse_query_gpu(text: str) -> list[Gpu]:
    """Parse ``nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader``."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and all(parts):
            gpus.append(Gpu(*parts))
    return gpus


def check_installed(ctx: Context, missing: list[str]) -> list[Gpu]:
    """The ``verify`` command: no device file ``missing`` (devnodes.missing_nodes, the ones
    doctor finds missing too), then nvidia-smi and what a workload needs; exit 9 otherwise."""
    if missing:
        raise VerifyError("device nodes missing on this node: "
                          f"{', '.join('/dev/' + m for m in missing)}",
                          hint="re-run install to load the driver and create them")
    gpus = nvidia_smi(ctx.install, ctx.runner, lib_dir=ctx.install.lib64)
    workloads_ready(ctx, lib_dir=ctx.install.lib64)
    return gpus


@dataclass(frozen=True)
class ReadinessCheck:
    """What a workload needs, proven after nvidia-smi: ``run`` raises VerifyError when it is
    not there, else returns what it saw, reported as ``key=<result>`` in driver-ready (and
    ``unchecked`` there when no verify ran, e.g. a staged plan's)."""

    key: str
    unchecked: str
    # (ctx, lib_dir: libraries not yet in the ld cache, or None; the results so far) -> result
    run: Callable[[Context, Path | None, Mapping[str, str]], str]


def workloads_ready(ctx: Context, *, lib_dir: Path | None = None) -> dict[str, str]:
    """Every readiness check, in CHECKS' order: each one's result by its key (a check sees
    the results of those before it)."""
    done: dict[str, str] = {}
    for check in CHECKS:
        done[check.key] = check.run(ctx, lib_dir, done)
    return done


def check_results(done: Mapping[str, str]) -> dict[str, str]:
    """Each check's result, in CHECKS' order (``unchecked`` for one that did not run)."""
    return {c.key: done.get(c.key, c.unchecked) for c in CHECKS}


def cuda_ready(ctx: Context, lib_dir: Path | None, done: Mapping[str, str]) -> str:
    """The CUDA check (cuda_check.py), or a warning naming the risk when it is skipped."""
    if ctx.settings.skip_cuda_check:
        log.warning("cuda_check_skipped", risk="nvidia-smi alone passed: nothing proves a "
                    "CUDA program will run (NVSwitch fabric, UVM files, compute mode)")
        return "skipped"
    if done.get(NVLINK_FABRIC) == "cuda":  # the gen-2 gate ended on this very check passing
        return "passed"
    if ctx.settings.cc_set_ready:
        set_cc_ready(ctx)
    result = cuda_check.check(ctx.install.lib64, ctx.kernel, ctx.runner, ctx.pci_gpus,
                              deadline_s=ctx.settings.cuda_check_deadline_s)
    return result.summary()


def daemons_ready(ctx: Context, lib_dir: Path | None, done: Mapping[str, str]) -> str:
    """The daemon sidecars the DaemonSet runs (--require-daemon), up within the deadline."""
    daemons.wait_up(ctx.install.root, ctx.settings.required_daemons, DAEMON_DEADLINE_S)
    return " ".join(ctx.settings.required_daemons)


def set_cc_ready(ctx: Context) -> None:
    """--cc-set-ready: on a GPU with confidential computing on, ``nvidia-smi conf-compute
    -srs 1`` once persistenced is up (NVIDIA's CC deployment guide sets it after
    persistenced; GKE's confidential nodes do it in their persistenced installer). It
    changes a GPU setting, so only when asked; a GPU with CC off is left alone."""
    smi, env = ctx.install.bin / "nvidia-smi", {"LD_LIBRARY_PATH": str(ctx.install.lib64)}
    on, ready = gpu_modes.query_cc(ctx.runner, smi, env)
    if not on or ready:
        log.info("cc_ready_state", cc_on=on, ready=ready, changed=False)
        return
    if daemons.PERSISTENCED in ctx.settings.required_daemons:
        daemons.wait_up(ctx.install.root, [daemons.PERSISTENCED], DAEMON_DEADLINE_S)
    try:
        ctx.runner.run([smi, "conf-compute", "-srs", "1"], timeout=SMI_TIMEOUT_S, env=env)
    except CommandError as exc:
        raise VerifyError(f"nvidia-smi conf-compute -srs 1 failed ({exc.reason}): "
                          f"{exc.stderr_tail(2) or '(no output)'}",
                          hint="the GPUs' confidential-computing ready state could not be set: "
                          "check the GPUs were attested and the container runs as root") from exc
    log.info("cc_ready_state", cc_on=True, ready=True, changed=True)


def fabric_ready(ctx: Context, lib_dir: Path | None, done: Mapping[str, str]) -> str:
    """A node with an NVLink fabric (fabric.detect: NVSwitch gen 2/3, NVLink5): the gate of
    its kind within --fabric-deadline, the fabric manager's sidecar alive (fabric.py);
    elsewhere nothing ("none")."""
    found = fabric.detect(ctx.kernel.sys_dir)
    if not found.present:
        return "none"
    smi = ctx.install.bin / "nvidia-smi"
    env = {"LD_LIBRARY_PATH": str(lib_dir)} if lib_dir is not None else {}

    def query() -> list[fabric.GpuFabric]:
        try:
            res = ctx.runner.run([smi, fabric.FABRIC_QUERY, "--format=csv,noheader"],
                                 timeout=SMI_TIMEOUT_S, env=env)
        except CommandError as exc:
            raise VerifyError(f"nvidia-smi {fabric.FABRIC_QUERY} failed: "
                              f"{exc.stderr_tail(2)}", hint=smi_failure_hint(exc.stderr)) from exc
        return fabric.parse(res.stdout)

    def manager_state() -> daemons.DaemonState | None:
        return daemons.read_state(ctx.install.root, daemons.FABRIC_MANAGER)

    def cuda_init() -> int | None:
        """The CUDA check once: None when it passed, 802 while the system is not ready."""
        try:
            cuda_check.check(ctx.install.lib64, ctx.kernel, ctx.runner, ctx.pci_gpus,
                             deadline_s=ctx.settings.cuda_check_deadline_s)
        except VerifyError as exc:
            error = exc.context.get("cuda_error") or {}
            if error.get("rc") == fabric.SYSTEM_NOT_READY:
                return fabric.SYSTEM_NOT_READY
            raise
        return None

    log.info("fabric_waiting", fabric=found.kind, devices=list(found.devices),
             device_files=fabric.nvswitch_device_files(ctx.kernel.dev_dir),
             deadline_s=ctx.settings.fabric_deadline_s)
    gate = fabric.Gate(query, lambda: (s.down() if (s := manager_state()) else None),
                       cuda_init=None if ctx.settings.skip_cuda_check else cuda_init,
                       manager_state=lambda: s.state if (s := manager_state()) else None)
    return fabric.wait_ready(gate, found, ctx.settings.fabric_deadline_s)


NVLINK_FABRIC = "NVLINK_FABRIC"
# Every readiness check, in the order they run (the fabric gate before CUDA: on an NVSwitch
# node CUDA fails until the fabric is up). A new check: its function, and one line here.
CHECKS: tuple[ReadinessCheck, ...] = (
    # "none", "completed" (fabric.state) or "cuda" (gen 2)
    ReadinessCheck(NVLINK_FABRIC, "not checked", fabric_ready),
    # "passed", "skipped", "deferred: ..." (cuda_check)
    ReadinessCheck("CUDA_CHECK", "not run", cuda_ready),
    # the daemons required (reported whether or not a verify ran)
    ReadinessCheck("DAEMONS", "", daemons_ready),
)


def nvidia_smi(tree: Tree, runner: Runner, *, lib_dir: Path | None = None) -> list[Gpu]:
    """Run nvidia-smi; ``lib_dir`` puts libraries not yet in the ld cache on the path."""
    smi = tree.bin / "nvidia-smi"
    env = {"LD_LIBRARY_PATH": str(lib_dir)} if lib_dir is not None else {}
    try:
        result = runner.run(
            [smi, "--query-gpu=name,driver_version,pci.bus_id", "--format=csv,noheader"],
            timeout=SMI_TIMEOUT_S,
            env=env,
        )
    except CommandError as exc:
        if exc.returncode != INFOROM_CORRUPTED:
            detail = exc.stderr_tail(2) or exc.stdout.strip()[-300:]
            hint = smi_failure_hint(exc.stdout + exc.stderr, exc.returncode)
            raise VerifyError(f"nvidia-smi failed: {detail}", hint=hint, path=str(smi)) from exc
        # Exit 14: a GPU's infoROM is corrupted; every row printed is valid (nvidia-smi(1),
        # RETURN VALUE; NVIDIA's GPU operator troubleshooting). A warning, not a failure:
        # the CUDA check that follows still proves the GPU works.
        log.warning("nvidia_smi_inforom_corrupted", exit_code=exc.returncode,
                    lines=[line for line in exc.stdout.splitlines() if "infoROM" in line],
                    hint="the GPU works, but its infoROM (ECC and page-retirement records) "
                    "is unreliable: plan an RMA or an infoROM update with your provider")
        result = exc.result
    gpus = parse_query_gpu(result.stdout)
    log.info("nvidia_smi_ok", gpus=[g.name for g in gpus],
             driver_version=gpus[0].driver_version if gpus else None)
    return gpus


# The real nvidia-smi's failure texts (535 and newer, from Debian's nvidia-smi and
# libnvidia-ml1) and what each means on a node we just installed.
SMI_FAILURES = (
    ("couldn't communicate with the NVIDIA driver",
     "the nvidia kernel module is not loaded or /dev/nvidiactl is missing: check the "
     "load_modules and device_nodes steps above and the kernel log"),
    ("version mismatch",
     "the loaded kernel module is another driver version than the libraries: drain the node "
     "and re-run to replace it, or reboot"),
    ("couldn't find libnvidia-ml.so",
     "libnvidia-ml.so.1 does not resolve: check <install-dir>/lib64 and the ld cache"),
    ("error while loading shared libraries",
     "a driver library does not resolve: check <install-dir>/lib64 and the ld cache"),
    ("No devices were found", "no NVIDIA GPU is visible on this node"),
    ("Failed to initialize NVML: Unknown Error",
     "NVML cannot open the GPU device nodes: check /dev/nvidia* exist and the container "
     "may use them (privileged)"),
)


INFOROM_CORRUPTED = gpu_modes.INFOROM_CORRUPTED
GPU_LOST = 15  # nvidia-smi(1), RETURN VALUE: "The GPU has fallen off the bus or has otherwise
#                become inaccessible"; the kernel log has Xid 79 for it (xid.REBOOT)
GPU_LOST_HINT = ("a GPU has fallen off the bus (nvidia-smi exit 15; Xid 79 in the kernel "
                 "log): drain the node and reboot it, nothing short of a reboot brings it "
                 "back; if it recurs, have the GPU or its host replaced")


def smi_failure_hint(output: str, returncode: int | None = None) -> str:
    if returncode == GPU_LOST or "GPU is lost" in output:
        return GPU_LOST_HINT
    return next((hint for text, hint in SMI_FAILURES if text in output),
                "check the kernel log (dmesg) and that the modules above are loaded")


def check_driver_version(gpus: list[Gpu], expected: str | None) -> None:
    """nvidia-smi must report the driver we meant to install, not an older one still loaded."""
    if expected is None:
        return
    reported = {g.driver_version for g in gpus}
    if reported and reported != {expected}:
        raise VerifyError(
            f"nvidia-smi reports driver {', '.join(sorted(reported))}, expected {expected}",
            hint="an old driver is still loaded: reboot the node or re-run after draining it",
        )
