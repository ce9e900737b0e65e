"""Issue 38 items 3 and 4: the NVLink fabric by kind (fabric.detect) and the gate of each kind
(fabric.wait_ready), on the fake clock (tests/fixtures/clock.py): no test waits in real time.

Sources (cited in installer/services/fabric.py too): NVSwitch device ids from open-gpu-kernel-modules
src/common/nvswitch/kernel/nvswitch.c (nvswitch_lr10_device_ids, nvswitch_ls10_device_ids);
the NVLink5 mark from NVIDIA/gpu-driver-container ubuntu24.04/nvidia-driver
(_assert_nvlink5_system); NVML's fabric info is Hopper-or-newer (nvmlDeviceGetGpuFabricInfo),
so an HGX A100 reads N/A (docs/nvidia-facts.md, "CUDA and the fabric on a real H100 node")."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from installer.base import cpuarch
from installer.base.errors import UsageError, VerifyError
from installer.services import fabric, fabricmanager, forking
from installer.services import sidecar_setup as sidecars
from installer.steps import fabric as fabric_steps
from tests.fixtures.clock import Clock
from tests.fixtures.kernel import NVSWITCH_LR10, NVSWITCH_LS10, FakeKernel

A100_NA = "00000000:07:00.0, N/A, N/A"  # fabric.state/status of an Ampere GPU, FM or not


@pytest.fixture
def fake(tmp_path):
    return FakeKernel(tmp_path / "kernel")


def test_nvswitch_generation_is_told_by_nvswitch_c_device_ids(fake):
    assert fabric.detect(fake.sys_dir) == fabric.Fabric(fabric.NONE)
    fake.add_nvswitch("0000:05:00.0", NVSWITCH_LR10)
    assert fabric.detect(fake.sys_dir) == fabric.Fabric(fabric.GEN2, ("0000:05:00.0",))
    fake.add_nvswitch("0000:06:00.0", NVSWITCH_LS10)  # mixed: neither table alone
    assert fabric.detect(fake.sys_dir).kind == fabric.UNKNOWN_GEN


def test_nvswitch_gen3_ls10(fake):
    fake.add_nvswitch("0000:05:00.0", "0x22a0")
    assert fabric.detect(fake.sys_dir).kind == fabric.GEN3


def test_nvlink5_is_the_infiniband_device_whose_vpd_holds_sw_mng_as_gpu_driver_container(fake):
    """_assert_nvlink5_system: no NVSwitch on the host's PCI bus, yet a fabric."""
    fake.add_gpu("0000:18:00.0", "0x2901")  # B200
    assert not fabric.nvswitches(fake.sys_dir)
    fake.add_nvlink5_bridge("mlx5_0")
    found = fabric.detect(fake.sys_dir)
    assert found == fabric.Fabric(fabric.NVLINK5, ("mlx5_0",))
    assert "SW_MNG" in found.describe()


def test_an_infiniband_device_without_sw_mng_is_no_nvlink5(fake):
    fake.add_nvlink5_bridge("mlx5_0")
    vpd = fake.sys_dir / "class/infiniband/mlx5_0/device/vpd"
    vpd.write_bytes(vpd.read_bytes().replace(b"SW_MNG", b"ETH_NI"))
    assert fabric.detect(fake.sys_dir).kind == fabric.NONE


def test_the_fabric_manager_is_planned_on_nvlink5_nodes_too(fake):
    """Before: fabric_steps planned it only for PCI class 0x0680, which NVLink5 lacks."""
    def probed():  # what detect.probe records of the node, as the plan reads it
        return SimpleNamespace(node=SimpleNamespace(
            fabric_present=fabric.detect(fake.sys_dir).present), arch=cpuarch.X86_64)

    assert fabric_steps.for_node(probed(), "570.124.06") == ()
    fake.add_nvlink5_bridge()
    assert [s.name for s in fabric_steps.for_node(probed(), "570.124.06")] == ["fabric_manager"]


def _gate(answers, *, cuda=None, manager="running", down=None):
    clock = Clock()
    smi = iter(answers)
    cuda_seq = iter(cuda or [])
    return fabric.Gate(
        lambda: fabric.parse(next(smi, answers[-1])), lambda: down, clock, clock.sleep,
        cuda_init=(lambda: next(cuda_seq, None)) if cuda is not None else None,
        manager_state=lambda: manager), clock


GEN2 = fabric.Fabric(fabric.GEN2, ("0000:05:00.0",))


def test_hgx_a100_with_the_fabric_manager_running_is_ready_well_before_the_deadline():
    """fabric.state stays N/A on Ampere: the gate is cuInit past 802, tried every POLL_S."""
    gate, clock = _gate([A100_NA], cuda=[802, 802, None])
    assert fabric.wait_ready(gate, GEN2, 600) == "cuda"
    assert clock.now == 2 * fabric.POLL_S  # 4 s of a 600 s deadline


def test_hgx_a100_without_the_fabric_manager_exits_9_naming_it_at_the_deadline():
    gate, clock = _gate([A100_NA], cuda=[802] * 1000, manager=None)
    with pytest.raises(VerifyError) as err:
        fabric.wait_ready(gate, GEN2, 30)
    assert err.value.exit_code == 9 and clock.now == 30
    assert err.value.message == (
        "NVLink fabric (NVSwitch gen 2 (lr10, HGX A100)) not ready within 30s: CUDA still "
        "returns 802 (system not ready) and no fabric manager reports on this node; these "
        "GPUs keep no fabric state (N/A), only the fabric manager trains it")
    assert "fabric-manager sidecar" in err.value.hint


def test_hgx_a100_with_a_dead_fabric_manager_fails_at_once():
    gate, clock = _gate([A100_NA], cuda=[802] * 1000, down="fabricmanager exited with status 1")
    with pytest.raises(VerifyError, match="fabric manager is not running: fabricmanager exited"):
        fabric.wait_ready(gate, GEN2, 600)
    assert clock.now == 0


def test_hgx_a100_another_cuda_failure_is_not_waited_on():
    def cuda_999():
        raise VerifyError("CUDA check: cuInit returned 999 CUDA_ERROR_UNKNOWN")
    clock = Clock()
    gate = fabric.Gate(lambda: fabric.parse(A100_NA), lambda: None, clock, clock.sleep,
                       cuda_init=cuda_999, manager_state=lambda: "running")
    with pytest.raises(VerifyError, match="999"):
        fabric.wait_ready(gate, GEN2, 600)
    assert clock.now == 0


def test_hgx_a100_with_the_cuda_check_skipped_waits_for_the_running_manager_only():
    gate, clock = _gate([A100_NA], cuda=None, manager="running")
    assert fabric.wait_ready(gate, GEN2, 600) == "cuda"
    gate, clock = _gate([A100_NA], cuda=None, manager="waiting")
    with pytest.raises(VerifyError, match="the CUDA check is skipped and the fabric manager's "
                       "sidecar is waiting"):
        fabric.wait_ready(gate, GEN2, 10)
    assert clock.now == 10


@pytest.mark.parametrize("kind", [fabric.GEN3, fabric.NVLINK5])
def test_hgx_h100_h200_and_b200_gate_on_fabric_state_never_on_cuda_alone(kind):
    """Gen 3 and NVLink5 GPUs keep a fabric state: Completed/Success is required, and a
    CUDA that answers is not taken instead."""
    rows = ["00000000:18:00.0, In Progress, N/A", "00000000:18:00.0, Completed, Success"]
    gate, clock = _gate(rows, cuda=[None])
    assert fabric.wait_ready(gate, fabric.Fabric(kind), 600) == "completed"
    assert clock.now == fabric.POLL_S
    gate, clock = _gate(["00000000:18:00.0, N/A, N/A"], cuda=[None])
    with pytest.raises(VerifyError, match="not Completed within 6s"):
        fabric.wait_ready(gate, fabric.Fabric(kind), 6)


def test_an_nvswitch_of_unknown_generation_is_gated_by_what_nvml_says():
    unknown = fabric.Fabric(fabric.UNKNOWN_GEN)
    gate, _ = _gate([A100_NA], cuda=[None])
    assert fabric.wait_ready(gate, unknown, 60) == "cuda"
    gate, _ = _gate(["00000000:18:00.0, Completed, Success"], cuda=[802])
    assert fabric.wait_ready(gate, unknown, 60) == "completed"


def test_doctor_reads_an_hgx_a100_na_as_no_state_to_wait_for():
    rows = fabric.parse(A100_NA)
    assert not fabric.state_gated(GEN2, rows)
    assert fabric.state_gated(fabric.Fabric(fabric.GEN3), rows)


# Issue 39: the operator's fabricmanager.cfg runs as root with the host's /dev.
def test_a_config_whose_paths_stay_in_the_install_dir_is_taken(tmp_path):
    cfg = (f"LOG_LEVEL=4\nLOG_FILE_NAME=\nDAEMONIZE=0\nBIND_INTERFACE_IP=127.0.0.1\n"
           f"TOPOLOGY_FILE_PATH={tmp_path}/fabricmanager/V/share/nvidia/nvswitch\n"
           f"# STATE_FILE_NAME=/etc/shadow (a comment)\n")
    fabricmanager.check_config(cfg, tmp_path)


@pytest.mark.parametrize("value", ["/etc/cron.d/x", "/var/log/fabricmanager.log",
                                   "{root}/../escape", "relative/path", "{root}/link/x"])
def test_a_config_naming_a_host_path_is_refused_with_its_key(tmp_path, value):
    root = tmp_path / "install"
    root.mkdir()
    (root / "link").symlink_to("/etc")
    cfg = f"LOG_LEVEL=4\nLOG_FILE_NAME={value.format(root=root)}\n"
    with pytest.raises(UsageError, match="fabric manager config line 2: LOG_FILE_NAME=") as err:
        fabricmanager.check_config(cfg, root)
    assert err.value.exit_code == 2 and "outside the install dir" in err.value.message


def test_the_sidecar_refuses_a_configmap_config_naming_a_host_path(tmp_path, monkeypatch,
                                                                   capsys):
    """`sidecar fabric-manager --config` before: the file went to nv-fabricmanager as it was.
    Now: exit 2 with the key named, the state file refused, nv-fabricmanager never started."""
    from installer import cli
    from installer.services import sidecar_setup as sidecars
    from installer.services import supervise as daemons

    started = []
    monkeypatch.setattr(fabric, "detect", lambda _sys: fabric.Fabric(fabric.GEN3, ("x",)))
    monkeypatch.setattr(sidecars, "wait_for_driver", lambda *_a, **_k: ("570.124.06",
                                                                         tmp_path / "fm"))
    monkeypatch.setattr(daemons, "run_foreground", lambda *a, **_k: started.append(a) or 0)
    cfg = tmp_path / "fabricmanager.cfg"
    cfg.write_text("DAEMONIZE=0\nLOG_FILE_NAME=/etc/ld.so.preload\n")
    with pytest.raises(SystemExit) as done:
        cli.main(["sidecar", "fabric-manager", "--install-dir", str(tmp_path / "install"),
                  "--config", str(cfg), "--log-format", "json"])
    assert done.value.code == 2 and not started
    err = capsys.readouterr().err
    assert "LOG_FILE_NAME='/etc/ld.so.preload' is outside the install dir" in err
    assert "Traceback" not in err
    state = daemons.read_state(tmp_path / "install", daemons.FABRIC_MANAGER)
    assert state is not None and state.state == daemons.REFUSED


# NVLink5: nvlsm as NVIDIA's nvidia-fabricmanager-start.sh starts it (fabricmanager.nvlsm_argv)


def test_the_bridge_port_guid_is_gid_0s_interface_id_as_ibstat_prints_it(fake):
    """libibumad umad_get_port: port_guid is GID 0's low 64 bits; ibstat prints 0x%016x."""
    fake.add_nvlink5_bridge("mlx5_2")
    assert fabricmanager.port_guid(fake.sys_dir, "mlx5_2") == "0x7425540300353de9"
    assert fabricmanager.port_guid(fake.sys_dir, "mlx5_9") is None
    gid = fake.sys_dir / "class/infiniband/mlx5_2/ports/1/gids/0"
    gid.write_text("fe80::7425:5403:35:3de9\n")  # not sysfs's form: refused, never guessed
    assert fabricmanager.port_guid(fake.sys_dir, "mlx5_2") is None


def test_nvlsm_and_the_fabric_manager_get_exactly_nvidias_options(tmp_path):
    """A B300 node's processes under nvidia-fabricmanager-start.sh: nvlsm -F <conf> -B
    --pid_file <pid> -g <GUID>; nv-fabricmanager -c <cfg> -g <GUID>. Without a GUID (NVSwitch
    gen 2/3) the fabric manager gets -c only, as gpu-driver-container runs it."""
    pid = tmp_path / "nvlsm.pid"
    assert fabricmanager.nvlsm_argv("/opt/nvidia/nvlsm/sbin/nvlsm", "/c", pid, "0x1") == [
        "/opt/nvidia/nvlsm/sbin/nvlsm", "-F", "/c", "-B", "--pid_file", str(pid), "-g", "0x1"]
    fm = tmp_path / "nv-fabricmanager"
    assert fabricmanager.fabric_manager_argv(fm, tmp_path / "f.cfg", "0x1") == [
        str(fm), "-c", str(tmp_path / "f.cfg"), "-g", "0x1"]
    assert fabricmanager.fabric_manager_argv(fm, tmp_path / "f.cfg", None) == [
        str(fm), "-c", str(tmp_path / "f.cfg")]


def _launcher(tmp_path, body: str) -> list[str]:
    script = tmp_path / "nvlsm"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return [str(script)]


def test_nvlsm_whose_pid_file_never_names_a_live_daemon_fails_within_the_bound(tmp_path):
    """The launcher returned 0 (daemonize() exits 0 before binding) but no daemon runs: the
    wait ends at NVLSM_START_S on the fake clock, naming nvlsm and its last output."""
    clock = Clock()
    argv = _launcher(tmp_path, "echo 'Perhaps another instance of OpenSM is already running'\n")
    with pytest.raises(VerifyError) as exc:
        sidecars.start_nvlsm(argv, tmp_path / "nvlsm.pid", {}, tmp_path / "nvlsm.log",
                             clock=clock, sleep=clock.sleep)
    assert clock.now >= sidecars.NVLSM_START_S
    assert exc.value.message == (
        f"nvlsm wrote no live pid to {tmp_path / 'nvlsm.pid'} within 30s: Perhaps another "
        "instance of OpenSM is already running")


def test_nvlsm_refusing_its_options_is_named_at_once(tmp_path):
    clock = Clock()
    argv = _launcher(tmp_path, "echo \"nvlsm: unrecognized option '$1'\"; exit 2\n")
    with pytest.raises(VerifyError) as exc:
        sidecars.start_nvlsm([*argv, "--foo"], tmp_path / "nvlsm.pid", {},
                             tmp_path / "nvlsm.log", clock=clock, sleep=clock.sleep)
    assert clock.now == 0
    assert exc.value.message == ("nvlsm exited with status 2 within 30s: nvlsm: unrecognized "
                                 "option '--foo'")


def test_a_dead_or_zombie_pid_is_not_alive(tmp_path):
    import subprocess

    child = subprocess.Popen(["true"])
    child.wait()
    assert not forking.pid_alive(child.pid)
    proc = tmp_path / "proc" / "4242"
    proc.mkdir(parents=True)
    (proc / "stat").write_text("4242 (nv lsm) Z 1 4242 4242 0 -1\n")
    assert forking.pid_alive(os.getpid(), tmp_path / "proc")  # no stat there: kill(0) says
    os.rename(proc, tmp_path / "proc" / str(os.getpid()))
    assert not forking.pid_alive(os.getpid(), tmp_path / "proc")


def test_the_fake_nvlsm_takes_only_nvidias_options(tmp_path):
    """The stand-in refuses what NVIDIA's start script does not pass, as OpenSM's getopt loop
    sends anything else to show_usage (tests/fixtures/fabricmanager.py NVLSM)."""
    import subprocess

    from tests.fixtures import fabricmanager as fake_fm

    binary, config = fake_fm.install_nvlsm(tmp_path)
    res = subprocess.run([binary, "-F", config, "--foreground"], capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 2 and "unrecognized option '--foreground'" in res.stdout
