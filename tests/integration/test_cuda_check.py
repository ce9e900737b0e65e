"""Issue 31 §1: verify and every install's verify step run CUDA (installer/services/cuda_check.py)
against the fixture's gcc-built libcuda (tests/fixtures/csrc/cuda.c), which fails each way a
real libcuda does. The states behind 100 and 999 were reproduced on a real H100
(docs/nvidia-facts.md, "CUDA and the fabric on a real H100 node"); 802 is what NVSwitch
systems give before the fabric manager ran; the other codes are cuda.h's."""

from __future__ import annotations

import pytest

from tests.pod import events, last_event, ok

# FAKE_CUDA_FAIL (cuda.c): the call that fails and its CUresult; the cause and the fix each
# must name.
ERROR_CLASSES = [
    ("cuInit:100", "CUDA_ERROR_NO_DEVICE: CUDA sees no GPU", "CUDA_VISIBLE_DEVICES"),
    ("cuInit:999", "CUDA_ERROR_UNKNOWN: CUDA cannot use the unified memory driver",
     "/dev/nvidia-uvm"),
    ("cuInit:3", "CUDA_ERROR_NOT_INITIALIZED", "reset or a reboot"),
    ("cuInit:802", "on an NVSwitch or NVLink5 system the fabric manager has not finished",
     "that sidecar idles and cannot help"),
    ("cuInit:803", "another driver version than this libcuda", "reboot"),
    ("cuInit:804", "forward-compatibility libcuda", "cuda-compat"),
    ("cuCtxCreate:46", "exclusive-process or prohibited compute mode", "nvidia-smi -c DEFAULT"),
    ("cuMemAlloc:2", "no memory left", "drain the node's GPU workloads"),
]


def _checked_cuda(install) -> None:
    passed = [e for e in events(install.stderr) if e.get("event") == "cuda_check_ok"]
    assert passed and passed[0]["gpus"] == 1, "the install's verify step ran no CUDA check"


@pytest.fixture
def installed(installed_once):
    """The module's one install (tests/integration/conftest.py): `verify` only reads the
    node, and its ReadOnlyPod fails a test whose run changed it."""
    pod, install = installed_once
    _checked_cuda(install)
    return pod


@pytest.fixture
def installed_here(pod):
    """An install of the test's own, for a test that changes the node first."""
    _checked_cuda(ok(pod.run("install")))
    return pod


@pytest.mark.parametrize("knob,cause,fix", ERROR_CLASSES, ids=[c[0] for c in ERROR_CLASSES])
def test_each_cuda_error_is_a_cause_and_a_fix_exit_9(installed, knob, cause, fix):
    proc = installed.run("verify", "-o", "json", env={"FAKE_CUDA_FAIL": knob})
    assert proc.returncode == 9, proc.stderr[-2000:]
    final = last_event(proc)
    call, code = knob.split(":")
    assert final["error"].startswith(f"CUDA check: {call} returned {code} "), final
    assert cause in final["error"], final
    assert fix in final["hint"], final


def test_cuda_visible_devices_hiding_the_gpu_is_named(installed):
    """The real H100 gave 100 for CUDA_VISIBLE_DEVICES=none (gpu-node/README.md, table)."""
    proc = installed.run("verify", "-o", "json", env={"CUDA_VISIBLE_DEVICES": "none"})
    assert proc.returncode == 9, proc.stderr[-2000:]
    assert "CUDA_VISIBLE_DEVICES='none' is set here" in last_event(proc)["error"]


def test_a_gpu_cuda_cannot_see_fails_the_count(installed_here, kernel):
    kernel.add_gpu("0000:00:05.0")
    proc = installed_here.run("verify", "-o", "json", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert proc.returncode == 9, proc.stderr[-2000:]
    assert ("CUDA sees 1 GPU(s), the PCI bus has 2 the driver did not exclude "
            "(0000:00:04.0, 0000:00:05.0)") in last_event(proc)["error"]


def test_memory_read_back_different_fails(installed):
    proc = installed.run("verify", "-o", "json", env={"FAKE_CUDA_FAIL": "roundtrip:corrupt"})
    assert proc.returncode == 9, proc.stderr[-2000:]
    assert "memory written on GPU 0 (0000:00:04.0) read back different" in last_event(proc)["error"]


def test_a_hung_cuinit_is_stopped_at_the_deadline(installed):
    """The pod's own timeout (120 s) fails this test if the installer waits on the hang."""
    proc = installed.run("verify", "-o", "json", "--cuda-check-deadline", "2",
                         env={"FAKE_CUDA_FAIL": "cuInit:hang"}, timeout=120)
    assert proc.returncode == 9, proc.stderr[-2000:]
    final = last_event(proc)
    assert "no answer from libcuda within 2s" in final["error"], final
    assert "reset or a reboot" in final["hint"]


def test_install_is_not_ready_while_cuda_fails(pod, node):
    proc = pod.run("install", env={"FAKE_CUDA_FAIL": "cuInit:802"})
    assert proc.returncode == 9, proc.stderr[-2000:]
    assert last_event(proc)["step"] == "verify"
    assert not (node.root / "run/nvidia/validations/driver-ready").exists()


def test_skip_cuda_check_verifies_with_nvidia_smi_alone_and_says_the_risk(installed):
    proc = installed.run("verify", "-o", "json", env={"FAKE_CUDA_FAIL": "cuInit:802",
                                        "NVIDIA_SKIP_CUDA_CHECK": "true"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    skipped = [e for e in events(proc.stderr) if e.get("event") == "cuda_check_skipped"]
    assert skipped and "nothing proves a CUDA program will run" in skipped[0]["risk"]
