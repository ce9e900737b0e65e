"""Issue 31 §2: an NVSwitch node is ready only through the fabric gate.

The fixture node has NVSwitch PCI functions (FakeKernel.add_nvswitch), NVIDIA's fabric
manager archive on the artifact server (tests/fixtures/fabricmanager.py, a fake
nv-fabricmanager that must be started), a fake nvidia-smi whose fabric.state is
"In Progress" until the fabric manager ran and a fake libcuda returning 802 until then
(tests/fixtures/csrc). The sidecar is the DaemonSet's: `sidecar fabric-manager`, started
with the pod, before the install."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from installer.services import cuda_probe
from tests.fixtures import fabricmanager
from tests.fixtures.kernel import NVSWITCH_LR10
from tests.fixtures.runfile import build_driver_run
from tests.integration.conftest import V1
from tests.pod import events, last_event, ok

H100, A100 = "0x2330", "0x20b0"  # gpus.MODELS
FM_PATH = f"/redist/fabricmanager/linux-x86_64/fabricmanager-linux-x86_64-{V1}-archive.tar.xz"


@pytest.fixture
def nvswitch(kernel, server):
    """HGX H100 (NVSwitch gen 3, ls10): the GPU an H100, whose fabric.state NVML keeps."""
    kernel.add_gpu("0000:00:04.0", H100)
    kernel.add_nvswitch()
    return {"NVIDIA_FABRIC_MANAGER_BASE_URL": fabricmanager.serve(server, V1),
            "NVIDIA_FABRIC_DEADLINE": "60"}


@pytest.fixture
def start_sidecar(sidecars):
    return lambda **env: sidecars("fabric-manager", **env)


def cuda_init(node, kernel) -> dict:
    """The installer's CUDA probe against the installed libcuda, outside any gate."""
    res = subprocess.run([sys.executable, "-I", cuda_probe.__file__,
                          str(node.install_dir / "lib64/libcuda.so.1"), "4096"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, **kernel.env()})
    return json.loads(res.stdout)


def names(proc) -> list[str]:
    return [e.get("event") for e in events(proc.stderr)]


def test_install_is_ready_only_after_the_fabric_manager_completed_the_fabric(
        pod, node, kernel, server, nvswitch, start_sidecar):
    start_sidecar()
    proc = ok(pod.run("install", env=nvswitch))
    seen = names(proc)
    assert "fabric_manager_installed" in seen
    assert seen.index("fabric_waiting") < seen.index("fabric_completed") < seen.index(
        "cuda_check_ok"), seen
    assert (node.install_dir / f"fabricmanager/{V1}/bin/nv-fabricmanager").is_file()
    assert (node.root / "run/nvidia/validations/driver-ready").is_file()
    assert cuda_init(node, kernel)["ok"]
    state = json.loads((node.install_dir / "daemons/fabricmanager.json").read_text())
    assert state["state"] == "running", state


def test_without_the_fabric_manager_nvidia_smi_is_green_cuda_is_802_and_install_fails(
        pod, node, kernel, nvswitch):
    proc = pod.run("install", env={**nvswitch, "NVIDIA_FABRIC_DEADLINE": "3"})
    assert proc.returncode == 9, proc.stderr[-3000:]
    final = last_event(proc)
    assert final["step"] == "verify"
    assert final["error"] == ("NVLink fabric not Completed within 3s: 00000000:00:04.0 "
                              "In Progress/N/A"), final
    assert "fabric-manager" in final["hint"]
    assert not (node.root / "run/nvidia/validations/driver-ready").exists()


def test_nvidia_smi_stays_green_while_cuda_says_802_until_the_fabric_manager_runs_again(
        pod, node, kernel, nvswitch, start_sidecar):
    """As after a reboot of the fabric (state lost), with the sidecar not yet back."""
    sidecar = start_sidecar()
    ok(pod.run("install", env=nvswitch))
    os.killpg(sidecar.pid, signal.SIGTERM)
    sidecar.communicate(timeout=30)
    (kernel.proc_dir / "driver/nvidia/fake-fabric-state").unlink()
    (node.install_dir / "daemons/fabricmanager.json").unlink()
    assert cuda_init(node, kernel)["error"]["rc"] == 802
    proc = pod.run("verify", "-o", "json", "--fabric-deadline", "2", env=nvswitch)
    assert proc.returncode == 9, proc.stderr[-3000:]
    assert last_event(proc)["error"] == ("NVLink fabric not Completed within 2s: "
                                         "00000000:00:04.0 In Progress/N/A")
    start_sidecar()
    ok(pod.run("verify", env=nvswitch))
    assert cuda_init(node, kernel)["ok"]


def test_a_dead_fabric_manager_fails_the_install_with_its_cause(pod, node, nvswitch,
                                                                 start_sidecar):
    start_sidecar(FAKE_FM_FAIL="request to query NVSwitch device information from NVSwitch "
                  "driver failed")
    proc = pod.run("install", env=nvswitch)
    assert proc.returncode == 9, proc.stderr[-3000:]
    error = last_event(proc)["error"]
    assert error.startswith("NVLink fabric not ready and the fabric manager is not running: "
                            "fabricmanager exited with status 1: "), error
    assert "request to query NVSwitch device information" in error
    assert not (node.root / "run/nvidia/validations/driver-ready").exists()


def test_the_fabric_manager_is_kept_with_the_driver(pod, kernel, server, nvswitch,
                                                     start_sidecar):
    start_sidecar()
    ok(pod.run("install", env=nvswitch))
    first = len(server.requests_for(FM_PATH))
    ok(pod.run("install", env=nvswitch))  # a cache hit: driver and fabric manager kept
    assert first == 1 and len(server.requests_for(FM_PATH)) == 1


def test_a_node_without_nvswitch_plans_and_fetches_nothing_of_it(pod, server):
    proc = ok(pod.run("install"))
    seen = names(proc)
    assert "fabric_waiting" not in seen and "fabric_manager_installed" not in seen
    assert not [r for r in server.requests if "/redist/" in r.path]


@pytest.fixture
def hgx_a100(kernel, server):
    """HGX A100: A100 GPUs (Ampere: NVML keeps no fabric state, nvidia-smi prints N/A) and an
    NVSwitch gen 2 (lr10, open-gpu-kernel-modules nvswitch.c nvswitch_lr10_device_ids)."""
    kernel.add_gpu("0000:00:04.0", A100)
    kernel.add_nvswitch(device=NVSWITCH_LR10)
    return {"NVIDIA_FABRIC_MANAGER_BASE_URL": fabricmanager.serve(server, V1),
            "NVIDIA_FABRIC_DEADLINE": "60"}


def fabric_columns(node, kernel) -> str:
    """What the installed nvidia-smi prints for the fabric, as the gate asks it."""
    res = subprocess.run([str(node.install_dir / "bin/nvidia-smi"),
                          "--query-gpu=fabric.state,fabric.status", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, **kernel.env(),
                              "LD_LIBRARY_PATH": str(node.install_dir / "lib64")})
    return res.stdout.strip()


def test_hgx_a100_with_the_fabric_manager_running_is_ready_well_before_the_deadline(
        pod, node, kernel, hgx_a100, start_sidecar):
    """Issue 38 item 3: fabric.state reads N/A on Ampere with a healthy fabric manager; the
    gate is cuInit past 802. Today's main waits for a Completed that never comes (exit 9 at
    the deadline)."""
    start_sidecar()
    proc = ok(pod.run("install", env=hgx_a100))
    seen = names(proc)
    # The gate's own CUDA check ends the wait, and is verify's CUDA check: it runs once.
    assert seen.count("cuda_check_ok") == 1, seen
    assert seen.index("fabric_waiting") < seen.index("cuda_check_ok") < seen.index(
        "fabric_cuda_ready"), seen
    assert fabric_columns(node, kernel) == "N/A, N/A"  # trained, and still N/A
    ready = (node.root / "run/nvidia/validations/driver-ready").read_text()
    assert "NVLINK_FABRIC=cuda" in ready.splitlines(), ready


def test_hgx_a100_without_the_fabric_manager_exits_9_naming_it(pod, node, kernel, hgx_a100):
    proc = pod.run("install", env={**hgx_a100, "NVIDIA_FABRIC_DEADLINE": "3"})
    assert proc.returncode == 9, proc.stderr[-3000:]
    final = last_event(proc)
    assert final["step"] == "verify"
    assert final["error"] == (
        "NVLink fabric (NVSwitch gen 2 (lr10, HGX A100)) not ready within 3s: CUDA still "
        "returns 802 (system not ready) and no fabric manager reports on this node; these "
        "GPUs keep no fabric state (N/A), only the fabric manager trains it"), final
    assert "fabric-manager sidecar" in final["hint"]
    assert not (node.root / "run/nvidia/validations/driver-ready").exists()


def test_hgx_h100_gen3_is_gated_on_fabric_state(pod, node, kernel, nvswitch, start_sidecar):
    """Gen 3 (ls10): NVML's fabric.state is the gate, Completed/Success once trained."""
    start_sidecar()
    ok(pod.run("install", env=nvswitch))
    assert fabric_columns(node, kernel) == "Completed, Success"
    ready = (node.root / "run/nvidia/validations/driver-ready").read_text()
    assert "NVLINK_FABRIC=completed" in ready.splitlines(), ready


def test_hgx_b200_nvlink5_is_recognised_and_the_sidecar_names_missing_nvlsm(
        pod, node, kernel, start_sidecar):
    """Issue 38 item 4: no NVSwitch on the host's PCI bus, an InfiniBand device whose VPD holds
    SW_MNG (gpu-driver-container _assert_nvlink5_system). Today's main idles ("no NVSwitch")
    and the CUDA check then sends the operator to that idle sidecar; now it exits 9 at once
    naming nvlsm, which the node image lacks, and the state file says so for the gate."""
    kernel.add_gpu("0000:00:04.0", "0x2901")  # B200
    kernel.add_nvlink5_bridge()
    sidecar = start_sidecar()
    _out, err = sidecar.communicate(timeout=60)
    assert sidecar.returncode == 9, err[-3000:]
    final = events(err)[-1]
    assert final["error"].startswith(
        "NVLink5 node: the fabric cannot complete without nvlsm (NVIDIA's NVLink subnet "
        "manager) at /opt/nvidia/nvlsm/sbin/nvlsm; nvlsm's config "
        "/usr/share/nvidia/nvlsm/nvlsm.conf (the nvlsm package's)"), final
    state = json.loads((node.install_dir / "daemons/fabricmanager.json").read_text())
    assert state["state"] == "refused" and "nvlsm" in state["detail"], state


B200 = "0x2901"
R580 = "580.82.07"  # B200 needs R570 or newer (gpus.MODELS)
BRIDGE_GUID = "0x7425540300353de9"  # FakeKernel.add_nvlink5_bridge's port 1


@pytest.fixture
def hgx_b200(kernel, server, tmp_path):
    """HGX B200 (NVLink5) with every piece NVIDIA's driver container wants: the SW_MNG bridge,
    mlx5_core and ib_umad loaded, /dev/infiniband/umad0, nvlsm and its config, the fabric
    manager archive; the sidecar's env points at the fake nvlsm."""
    kernel.add_gpu("0000:00:04.0", B200)
    kernel.add_nvlink5_bridge()
    kernel.load_infiniband()
    binary, config = fabricmanager.install_nvlsm(tmp_path / "nvlsm-pkg")
    server.serve_run(R580, build_driver_run(tmp_path / "runs", R580))
    return {"install": {"NVIDIA_FABRIC_MANAGER_BASE_URL": fabricmanager.serve(server, R580),
                        "NVIDIA_FABRIC_DEADLINE": "60", "NVIDIA_DRIVER_VERSION": R580},
            "sidecar": {"NVIDIA_NVLSM": binary, "NVIDIA_NVLSM_CONFIG": config},
            "nvlsm": binary, "config": config}


def stop(sidecar) -> list[dict]:
    if sidecar.poll() is None:
        os.killpg(sidecar.pid, signal.SIGTERM)
    return events(sidecar.communicate(timeout=60)[1])


def test_hgx_b200_nvlink5_starts_nvlsm_then_the_fabric_manager_and_is_ready(
        pod, node, kernel, hgx_b200, start_sidecar):
    """Issue 38 item 4: with everything in place the sidecar starts nvlsm as NVIDIA's
    nvidia-fabricmanager-start.sh does (-F <nvlsm.conf> -B --pid_file <pid> -g <bridge port
    GUID>), then nv-fabricmanager -c <cfg> -g <GUID>; the fake fabric manager trains only with
    nvlsm of that GUID up, and the install is ready well before its deadline. Today's main
    never starts nvlsm: the sidecar exits 9 (no nvlsm on PATH) and the install with it."""
    sidecar = start_sidecar(**hgx_b200["sidecar"])
    ok(pod.run("install", env=hgx_b200["install"]))
    assert fabric_columns(node, kernel) == "Completed, Success"
    ready = (node.root / "run/nvidia/validations/driver-ready").read_text()
    assert "NVLINK_FABRIC=completed" in ready.splitlines(), ready
    assert (kernel.proc_dir / "driver/nvidia/fake-nvlsm").read_text().split()[1] == BRIDGE_GUID
    seen = stop(sidecar)
    started = [e for e in seen if e.get("event") in ("nvlsm_started", "daemon_started")]
    assert [e["event"] for e in started] == ["nvlsm_started", "daemon_started"], seen
    nvlsm_argv, fm_argv = started[0]["argv"], started[1]["argv"]
    assert nvlsm_argv[:5] == [hgx_b200["nvlsm"], "-F", hgx_b200["config"], "-B", "--pid_file"]
    assert nvlsm_argv[5].endswith("/daemons/nvlsm.pid") and nvlsm_argv[6:] == ["-g", BRIDGE_GUID]
    assert fm_argv[0].endswith("/bin/nv-fabricmanager") and fm_argv[1] == "-c"
    assert fm_argv[3:] == ["-g", BRIDGE_GUID], fm_argv
    # the pod stopping stops nvlsm too (its SIGTERM handler removes its socket stand-in)
    assert not (kernel.proc_dir / "driver/nvidia/fake-nvlsm").exists()


def test_hgx_b200_nvlsm_dying_ends_the_sidecar_naming_it(pod, node, kernel, hgx_b200,
                                                        start_sidecar):
    """A dying nvlsm is the pod's concern: the sidecar stops the fabric manager and exits 9
    with one line naming nvlsm, and its state file says the same for the install's gate."""
    sidecar = start_sidecar(**hgx_b200["sidecar"], FAKE_NVLSM_EXIT_AFTER="4")
    ok(pod.run("install", env=hgx_b200["install"]))
    _out, err = sidecar.communicate(timeout=60)
    assert sidecar.returncode == 9, err[-3000:]
    final = events(err)[-1]
    assert final["error"].startswith("nvlsm (pid "), final
    assert final["error"].endswith(") exited: the NVLink fabric lost its subnet manager"), final
    assert "Traceback" not in err
    state = json.loads((node.install_dir / "daemons/fabricmanager.json").read_text())
    assert state["state"] == "exited" and state["detail"] == final["error"], state
