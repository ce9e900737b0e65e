"""fabric.py, fabricmanager.py and services/sidecar_setup.py: the NVSwitch pieces that need no node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from installer.base.errors import IntegrityError, VerifyError
from installer.kmod.kernel import KernelState
from installer.services import fabric, fabricmanager
from installer.services import sidecar_setup as sidecars
from tests.fixtures.clock import Clock

V = "570.124.06"
# What nvidia-smi printed on a real H100 node without NVSwitch (gpu-node/README.md).
NO_FABRIC = "00000000:00:06.0, N/A, N/A\n"


def _pci(root: Path, addr: str, cls: str, device: str = "0x2330", vendor: str = "0x10de"):
    dev = root / "bus/pci/devices" / addr
    dev.mkdir(parents=True)
    for name, value in (("vendor", vendor), ("device", device), ("class", cls)):
        (dev / name).write_text(value + "\n")


def test_nvswitches_are_told_by_pci_class_not_by_proc_devices(tmp_path):
    _pci(tmp_path, "0000:00:06.0", "0x030200")
    _pci(tmp_path, "0000:05:00.0", "0x068000", "0x22a3")
    _pci(tmp_path, "0000:06:00.0", "0x068000", "0x1234", vendor="0x8086")
    assert fabric.nvswitches(tmp_path) == ["0000:05:00.0"]


def test_na_means_no_fabric_not_a_fabric_not_ready():
    assert not fabric.has_fabric(fabric.parse(NO_FABRIC))
    assert fabric.has_fabric(fabric.parse("00000000:18:00.0, In Progress, N/A\n"))


def _gate(answers, down=lambda: None):
    """nvidia-smi answering ``answers`` in turn, then the last one again and again."""
    clock, seq = Clock(), iter(answers)
    return fabric.Gate(lambda: fabric.parse(next(seq, answers[-1])), down, clock,
                       clock.sleep), clock


def test_the_gate_waits_for_completed_success():
    gate, clock = _gate(["00000000:18:00.0, In Progress, N/A",
                         "00000000:18:00.0, Completed, Success"])
    assert [r.state for r in fabric.wait_completed(gate, 60)] == ["Completed"]
    assert clock.now == fabric.POLL_S


def test_the_gate_names_a_failed_gpu_and_a_dead_manager_and_the_deadline():
    gate, _ = _gate(["00000000:18:00.0, Completed, NVSwitch training failure"])
    with pytest.raises(VerifyError, match="fabric failed on 00000000:18:00.0 Completed/"
                       "NVSwitch training failure"):
        fabric.wait_completed(gate, 60)
    gate, _ = _gate(["00000000:18:00.0, In Progress, N/A"], down=lambda: "exited 1: boom")
    with pytest.raises(VerifyError, match="fabric manager is not running: exited 1: boom"):
        fabric.wait_completed(gate, 60)
    gate, clock = _gate(["00000000:18:00.0, In Progress, N/A"])
    with pytest.raises(VerifyError, match="not Completed within 10s: 00000000:18:00.0 "
                       "In Progress/N/A"):
        fabric.wait_completed(gate, 10)
    assert clock.now == 10


def _redistrib(path: str, sha: str = "a" * 64) -> str:
    return json.dumps({"fabricmanager": {"linux-x86_64": {"relative_path": path, "sha256": sha}}})


def test_the_digest_pin_comes_from_redistrib_json_for_exactly_this_version():
    good = f"fabricmanager/linux-x86_64/fabricmanager-linux-x86_64-{V}-archive.tar.xz"
    assert fabricmanager.pinned_sha256(_redistrib(good), V) == "a" * 64
    other = good.replace(V, "570.86.15")
    with pytest.raises(IntegrityError, match="not the fabric manager of driver"):
        fabricmanager.pinned_sha256(_redistrib(other), V)
    with pytest.raises(IntegrityError, match="lists no fabric manager"):
        fabricmanager.pinned_sha256("{}", V)


def test_the_config_runs_in_the_foreground_logging_to_stderr(tmp_path):
    template = "LOG_LEVEL=4\nLOG_FILE_NAME=/var/log/fabricmanager.log\nDAEMONIZE=1\n"
    out = sidecars.fabric_config(template, tmp_path)
    assert out.splitlines() == ["LOG_LEVEL=4", "LOG_FILE_NAME=", "DAEMONIZE=0",
                                f"TOPOLOGY_FILE_PATH={tmp_path}/share/nvidia/nvswitch"]


def test_nvlink5_names_what_is_missing(tmp_path):
    """gpu-driver-container ubuntu24.04/nvidia-driver _ensure_nvlink5_prerequisites
    (mlx5_core, ib_umad), the umad device nvlsm binds through, the bridge port's GUID the start
    script passes (-g), and nvlsm with its config (_start_daemons): each one named."""
    dev = tmp_path / "dev"
    dev.mkdir()
    kernel = KernelState(proc_dir=tmp_path / "proc", sys_dir=tmp_path / "sys", dev_dir=dev)
    missing = sidecars.nvlink5_missing(kernel, "mlx5_0")
    assert missing == ["the mlx5_core kernel module (modprobe mlx5_core)",
                       "the ib_umad kernel module (modprobe ib_umad)",
                       "/dev/infiniband/umad* device files",
                       "the port GUID of mlx5_0 (/sys/class/infiniband/mlx5_0/ports/1/gids/0)"]
    binary, config = tmp_path / "nvlsm", tmp_path / "nvlsm.conf"
    assert sidecars.nvlsm_missing(str(binary), str(config)) == [
        f"nvlsm (NVIDIA's NVLink subnet manager) at {binary}",
        f"nvlsm's config {config} (the nvlsm package's)"]
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    config.write_text("")
    assert sidecars.nvlsm_missing(str(binary), str(config)) == []


def test_an_nvlink5_node_lacking_its_pieces_ends_the_sidecar_with_exit_9(tmp_path, monkeypatch,
                                                                         capsys):
    """The sidecar names what is missing and exits 9 (docs/contract.md §3), like any sidecar
    that cannot start its daemon; the state file says why, so the install's gate does too."""
    from installer import cli
    from installer.services import supervise as daemons

    missing = ["nvlsm (NVIDIA's NVLink subnet manager) on PATH"]
    monkeypatch.setattr(fabric, "detect", lambda _sys: fabric.Fabric(fabric.NVLINK5, ("mlx5_0",)))
    monkeypatch.setattr(sidecars, "wait_for_driver", lambda *_a, **_k: (V, tmp_path / "fm"))
    monkeypatch.setattr(sidecars, "nvlsm_missing", lambda _binary, _config: [])
    monkeypatch.setattr(sidecars, "nvlink5_missing", lambda _kernel, _bridge: missing)
    with pytest.raises(SystemExit) as done:
        cli.main(["sidecar", "fabric-manager", "--install-dir", str(tmp_path),
                  "--log-format", "json"])
    assert done.value.code == 9
    err = capsys.readouterr().err
    assert "NVLink5 node: the fabric cannot complete without nvlsm" in err
    assert "Traceback" not in err
    state = daemons.read_state(tmp_path, daemons.FABRIC_MANAGER)
    assert state is not None and state.state == daemons.REFUSED, state
