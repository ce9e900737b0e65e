"""Issue 38: every node shape GKE sells is ready or told exactly why (docs/node-shapes.md, one
test per row). The fake kernel keeps each GPU state where the real one lives (a GPU setting in
its sysfs dir, survives a reboot; what the driver holds under /proc/driver/nvidia, gone with
an unload): tests/fixtures/csrc/fakenv.h names the files. The fake nvidia-smi and libcuda
read them and answer as NVIDIA's do (the sources are cited there)."""

from __future__ import annotations

import json
import os

import pytest

from tests.fixtures.kernel import FakeKernel
from tests.pod import events, last_event, ok

READY = "run/nvidia/validations/driver-ready"
METRICS = "/var/lib/node_exporter/textfile_collector/nvidia.prom"
H100 = "0x2330"  # NVIDIA H100 80GB HBM3, MIG- and CC-capable
GPU0, GPU1 = "0000:00:04.0", "0000:00:05.0"


@pytest.fixture
def kernel(node, tmp_path):
    """A node with no GPU yet: each test adds its own shape."""
    return FakeKernel(tmp_path / "kernel", node.kernel_release)


def gpu_state(kernel, addr: str, name: str, value: str) -> None:
    """A GPU's own setting (survives reboots): MIG mode, CC mode, a fault, compute mode."""
    (kernel.sys_dir / "bus/pci/devices" / addr / name).write_text(value + "\n")


def driver_state(kernel, addr: str, name: str, lines: list[str]) -> None:
    """What the loaded driver holds for a GPU: MIG instances, compute processes."""
    path = kernel.proc_dir / "driver/nvidia/gpus" / addr / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))


def ready(node) -> dict[str, str]:
    text = (node.root / READY).read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def cuda_ok(proc) -> list[dict]:
    return [e for e in events(proc.stderr) if e.get("event") == "cuda_check_ok"]


def doctor_finding(pod, check: str) -> tuple[int, dict]:
    proc = pod.run("doctor", "--json")
    doc = json.loads(proc.stdout)
    return proc.returncode, {f["check"]: f for f in doc["findings"]}[check]


def test_one_gpu_is_ready_once_cuda_ran_on_it(pod, kernel, node):
    kernel.add_gpu(GPU0)  # an L4
    proc = ok(pod.run("install"))
    assert [e["gpus"] for e in cuda_ok(proc)] == [1]
    assert ready(node)["CUDA_CHECK"] == "passed"


def test_eight_gpus_are_each_proven(pod, kernel, node):
    for i in range(8):
        kernel.add_gpu(f"0000:00:{4 + i:02x}.0", H100)
    proc = ok(pod.run("install"))
    assert [e["gpus"] for e in cuda_ok(proc)] == [8]
    assert ready(node)["GPU_COUNT"] == "8" and ready(node)["CUDA_CHECK"] == "passed"


def test_mig_without_instances_is_ready_with_cuda_deferred_and_says_so_everywhere(
        pod, kernel, node):
    """Fails on main: CUDA sees no device on a MIG GPU without instances (exit 9 on every
    try, and GKE's partition-gpus, which runs after this container, never makes them)."""
    kernel.add_gpu(GPU0, H100)
    gpu_state(kernel, GPU0, ".fake-mig-mode", "1")
    proc = pod.run("install", "--metrics-file", METRICS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    why = f"deferred: MIG mode on GPU {GPU0}, no instances yet"
    assert ready(node)["CUDA_CHECK"] == why
    assert json.loads((node.install_dir / "status.json").read_text())["cuda_check"] == why
    prom = (node.root / METRICS.lstrip("/")).read_text()
    assert f'nvidia_driver_installer_cuda_check_deferred{{detail="{why}"}} 1' in prom
    code, finding = doctor_finding(pod, "cuda")
    assert finding["verdict"] == "warn" and why in finding["detail"], finding
    assert "partition-gpus" in finding["fix"]
    rerun = pod.run("install")  # the init container's next try: the same answer
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert ready(node)["CUDA_CHECK"] == why


def test_mig_instances_made_later_are_each_proven_by_verify_and_doctor(pod, kernel, node):
    kernel.add_gpu(GPU0, H100)
    gpu_state(kernel, GPU0, ".fake-mig-mode", "1")
    ok(pod.run("install"))
    # partition-gpus: nvidia-smi mig -cgi 9,9 -C on an H100 80GB (two 3g.40gb)
    driver_state(kernel, GPU0, ".fake-mig-instances", ["3g.40gb 1 0", "3g.40gb 2 0"])
    proc = ok(pod.run("verify", "-o", "json"))
    assert [e["gpus"] for e in cuda_ok(proc)] == [1, 1]  # one child per MIG device
    assert not [e for e in events(proc.stderr) if e.get("event") == "cuda_check_deferred"]
    code, finding = doctor_finding(pod, "cuda")
    assert finding["verdict"] == "ok", finding
    assert finding["detail"].startswith("2 device(s) (2 MIG device(s))")


def test_mig_mixed_with_plain_gpus_proves_the_plain_ones_and_defers_the_mig_one(
        pod, kernel, node):
    """Fails on main: CUDA sees 1 device, the PCI bus has 2 (exit 9)."""
    kernel.add_gpu(GPU0, H100)
    kernel.add_gpu(GPU1, H100)
    gpu_state(kernel, GPU1, ".fake-mig-mode", "1")
    proc = pod.run("install")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [e["gpus"] for e in cuda_ok(proc)] == [1]
    assert ready(node)["CUDA_CHECK"] == f"deferred: MIG mode on GPU {GPU1}, no instances yet"
    driver_state(kernel, GPU1, ".fake-mig-instances", ["1g.10gb 7 0", "1g.10gb 8 0",
                                                         "1g.10gb 9 0"])
    proc = ok(pod.run("verify", "-o", "json"))
    assert [e["gpus"] for e in cuda_ok(proc)] == [1, 1, 1, 1]


def test_cc_mode_not_ready_is_named_not_blamed_on_the_fabric_manager(pod, kernel, node):
    """Fails on main: its 802 message says the fabric manager has not finished the fabric
    on a node that has no NVSwitch."""
    kernel.add_gpu(GPU0, H100)
    gpu_state(kernel, GPU0, ".fake-cc-mode", "on")
    proc = pod.run("install")
    assert proc.returncode == 9, proc.stderr[-3000:]
    final = last_event(proc)
    assert "confidential computing is on" in final["error"], final
    assert "fabric manager has not finished" not in final["error"]
    assert "--cc-set-ready" in final["hint"]
    assert ["conf-compute", "-srs", "1"] not in [c["argv"] for c in kernel.calls("nvidia-smi")]


def test_cc_set_ready_only_when_asked_then_ready(pod, kernel, node):
    kernel.add_gpu(GPU0, H100)
    gpu_state(kernel, GPU0, ".fake-cc-mode", "on")
    proc = pod.run("install", "--cc-set-ready")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ["conf-compute", "-srs", "1"] in [c["argv"] for c in kernel.calls("nvidia-smi")]
    assert ready(node)["CUDA_CHECK"] == "passed"


def test_a_gpu_fallen_off_the_bus_names_the_reboot(pod, kernel, node):
    """Fails on main: exit 15's hint was the generic "check the kernel log"."""
    kernel.add_gpu(GPU0, H100)
    kernel.add_gpu(GPU1, H100)
    gpu_state(kernel, GPU1, ".fake-lost", "lost")
    proc = pod.run("install")
    assert proc.returncode == 9, proc.stderr[-3000:]
    final = last_event(proc)
    assert "GPU is lost" in final["error"], final
    assert "reboot" in final["hint"] and "Xid 79" in final["hint"], final
    assert not (node.root / READY).exists()


def test_inforom_corrupted_exit_14_warns_and_the_node_is_ready(pod, kernel, node):
    """Fails on main: nvidia-smi's exit 14 (rows valid) failed the verify (exit 9)."""
    kernel.add_gpu(GPU0, H100)
    gpu_state(kernel, GPU0, ".fake-inforom", "corrupt")
    proc = pod.run("install")
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [e for e in events(proc.stderr) if e.get("event") == "nvidia_smi_inforom_corrupted"]
    assert warned and "infoROM is corrupted" in warned[0]["lines"][0]
    assert ready(node)["GPU_COUNT"] == "1" and ready(node)["CUDA_CHECK"] == "passed"


def test_a_gpu_bound_to_vfio_pci_is_not_expected_by_cuda(pod, kernel, node):
    """Fails on main: CUDA sees 1 GPU, the PCI bus has 2 (the passed-through one)."""
    kernel.add_gpu(GPU0, H100)
    kernel.add_gpu(GPU1, H100)
    vfio = kernel.sys_dir / "bus/pci/drivers/vfio-pci"
    vfio.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(vfio, kernel.sys_dir / "bus/pci/devices" / GPU1),
               kernel.sys_dir / "bus/pci/devices" / GPU1 / "driver")
    proc = pod.run("install")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [e["gpus"] for e in cuda_ok(proc)] == [1]
    skipped = [e for e in events(proc.stderr) if e.get("event") == "cuda_check_gpu_not_ours"]
    assert skipped and skipped[0]["driver"] == "vfio-pci" and skipped[0]["gpu"] == GPU1


def test_busy_gpus_on_a_rerun_are_not_a_failure(pod, kernel, node):
    """Exclusive-process mode with a CUDA job on GPU0: 46 there. Fails on main: a rerun on
    a working node whose GPUs run CUDA jobs exited 9."""
    kernel.add_gpu(GPU0, H100)
    kernel.add_gpu(GPU1, H100)
    ok(pod.run("install"))
    driver_state(kernel, GPU0, ".fake-compute-apps", ["4242 python3 70000"])
    gpu_state(kernel, GPU0, ".fake-compute-mode", "Exclusive_Process")
    proc = pod.run("install", "--force")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ready(node)["CUDA_CHECK"] == (f"passed; busy: GPU {GPU0} held by python3 (pid "
                                         "4242) (cuCtxCreate returned 46)")
    assert [e["gpus"] for e in cuda_ok(proc)] == [1]  # GPU1, proven after the busy one


def test_a_gpu_with_its_memory_full_on_a_rerun_is_not_a_failure(pod, kernel, node):
    kernel.add_gpu(GPU0, H100)
    ok(pod.run("install"))
    driver_state(kernel, GPU0, ".fake-compute-apps", ["4242 python3 81000"])
    proc = pod.run("verify", "-o", "json", env={"FAKE_CUDA_FAIL": "cuMemAlloc:2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    busy = [e for e in events(proc.stderr) if e.get("event") == "cuda_check_gpu_busy"]
    assert busy and busy[0]["processes"] == ["python3 (pid 4242)"]


def test_a_busy_code_without_a_process_on_the_gpu_still_fails(pod, kernel, node):
    kernel.add_gpu(GPU0, H100)
    ok(pod.run("install"))
    gpu_state(kernel, GPU0, ".fake-compute-mode", "Exclusive_Process")
    proc = pod.run("verify", "-o", "json", env={"FAKE_CUDA_FAIL": "cuCtxCreate:46"})
    assert proc.returncode == 9, proc.stderr[-3000:]
    assert "CUDA_ERROR_DEVICES_UNAVAILABLE" in last_event(proc)["error"]
