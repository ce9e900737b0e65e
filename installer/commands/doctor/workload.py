"""doctor's lines for what "ready" means beyond nvidia-smi (docs/node-shapes.md): the daemons, the
NVSwitch fabric, CUDA itself, and the kernel log's GPU faults."""

from __future__ import annotations

from installer.base.errors import InstallerError
from installer.commands.doctor.node import FAIL, OK, WARN, Finding, Node
from installer.host.runner import CommandError
from installer.kmod import xid
from installer.kmod.diagnostics import read_kernel_log
from installer.services import cuda_check, fabric, health
from installer.services import supervise as daemons
from installer.services.verify import SMI_TIMEOUT_S

DAEMON_NAMES = daemons.NAMES


def check_daemons(n: Node) -> Finding:
    states = [s for name in DAEMON_NAMES if (s := daemons.read_state(n.install.root, name))]
    if not states:
        return Finding("daemons", OK, "no daemon sidecar reports here (none rendered: "
                       "manifests render --nvswitch / --persistenced)")
    down = [f"{s.name}: {why}" for s in states if (why := s.down())]
    if down:
        return Finding("daemons", FAIL, "; ".join(down),
                       "read the sidecar's log (kubectl logs <pod> -c nvidia-<daemon>)")
    waiting = [s.name for s in states if s.state == daemons.WAITING]
    shown = ", ".join(f"{s.name} {s.state}" for s in states)
    if waiting:
        return Finding("daemons", WARN, shown, "the sidecars wait for the install to finish")
    return Finding("daemons", OK, shown)


def check_fabric(n: Node) -> Finding:
    found = fabric.detect(n.kernel.sys_dir)
    if not found.present:
        return Finding("nvlink_fabric", OK, "no NVLink fabric (no NVSwitch on the PCI bus, no "
                       "NVLink5 InfiniBand device): no fabric to wait for")
    files = fabric.nvswitch_device_files(n.kernel.dev_dir)
    try:
        res = n.runner.run([n.install.bin / "nvidia-smi", fabric.FABRIC_QUERY,
                            "--format=csv,noheader"], timeout=SMI_TIMEOUT_S,
                           env={"LD_LIBRARY_PATH": str(n.install.lib64)})
        rows = fabric.parse(res.stdout)
    except CommandError as exc:
        return Finding("nvlink_fabric", FAIL, f"nvidia-smi {fabric.FABRIC_QUERY} failed: "
                       f"{exc.stderr_tail(2)}", "fix nvidia_smi first")
    seen = ", ".join(r.describe() for r in rows) or "no GPU answered"
    detail = f"{found.describe()}, device files: {', '.join(files) or 'none'}; {seen}"
    if not fabric.state_gated(found, rows):  # HGX A100: N/A; the cuda line proves it
        return Finding("nvlink_fabric", OK, detail + " (these GPUs keep no fabric state: "
                       "the cuda check proves the fabric)")
    if rows and all(r.done for r in rows):
        return Finding("nvlink_fabric", OK, detail)
    return Finding("nvlink_fabric", FAIL, detail, fabric.MANAGER_HINT)


def check_cuda(n: Node) -> Finding:
    if n.loaded_version is None:
        return Finding("cuda", FAIL, "not run: the nvidia module is not loaded",
                       "fix kernel_modules first")
    try:
        result = cuda_check.check(n.install.lib64, n.kernel, n.runner, n.pci)
    except InstallerError as exc:
        return Finding("cuda", FAIL, exc.message, exc.hint or "")
    if result.deferred:
        return Finding("cuda", WARN, result.describe(),
                       "the MIG partitioner (GKE's partition-gpus) has not made the instances "
                       "yet; run doctor or verify again once it has")
    return Finding("cuda", OK, result.describe())


def check_kernel_log(n: Node) -> Finding:
    """Xid/GSP faults the driver logged since it was loaded (an Xid of an earlier load, or
    of the GPU before a reboot, is no fault of the driver that runs now)."""
    records = read_kernel_log(n.kernel, n.runner)
    if isinstance(records, str):
        return Finding("kernel_log", WARN, f"kernel log unreadable ({records})",
                       "run doctor privileged to read Xid lines")
    current, seen_load = xid.since_driver_load(records)
    events = xid.parse(current)
    serious = [e for e in events if e.action]
    span = "since the driver was loaded" if seen_load else "in the kernel log"
    if not serious:
        return Finding("kernel_log", OK, f"{len(events)} NVIDIA Xid/GSP line(s) {span}, none "
                       "asking for a GPU reset or a reboot")
    reboot = any(e.action == "reboot" for e in serious)
    shown = "; ".join(dict.fromkeys(e.describe() for e in serious))
    return Finding("kernel_log", FAIL, shown[:600],
                   "drain the node, then " + ("reboot it" if reboot else
                                              "reset the GPU (nvidia-smi -r) or reboot"))


def check_gpu_health(n: Node) -> Finding:
    """The health sidecar's last verdict (<install-dir>/daemons/health.json), as old as it is:
    doctor's own kernel_log line reads the log now, this one says what the cluster sees."""
    doc = health.read_status(n.install.root)
    if doc is None:
        return Finding("gpu_health", OK, "no health sidecar reports here (manifests render "
                       "--health adds one)")
    when = str(doc.get("checked_at", "?"))
    if doc.get("healthy") is True:
        return Finding("gpu_health", OK, f"the health sidecar found no problem (checked {when})")
    problems = doc.get("problems")
    shown = "; ".join(map(str, problems)) if isinstance(problems, list) else "?"
    return Finding("gpu_health", FAIL, f"the health sidecar says action "
                   f"{doc.get('action', '?')} (checked {when}): {shown}"[:600],
                   "docs/health-and-metrics.md says what each action needs; "
                   "kubectl logs <pod> -c nvidia-gpu-health")
