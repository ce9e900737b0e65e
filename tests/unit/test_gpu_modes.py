"""installer.services.gpu_modes' parsers, on the lines NVIDIA's tools print (sources in its docstring)."""

from __future__ import annotations

from installer.services import gpu_modes

# `nvidia-smi -L` with MIG devices, in the format NVIDIA's MIG user guide and GKE's and
# NVIDIA's own parsers show (two A100-SXM4-40GB, one in MIG mode with two 1g.5gb devices).
LISTING = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-838f60d9-651f-9166-ea42-f9da674a6947)
  MIG 1g.5gb      Device  0: (UUID: MIG-ffda444c-c706-57c6-98c9-67c441a0b109)
  MIG 1g.5gb      Device  1: (UUID: MIG-fe9bc608-60f5-5479-8cc4-1827021d27a9)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-e109d8d9-923e-7235-0429-96b7fdbcbd30)
"""


def test_mig_devices_are_read_under_their_gpu():
    found = gpu_modes.parse_mig_list(LISTING)
    assert [m.uuid for m in found["GPU-838f60d9-651f-9166-ea42-f9da674a6947"]] == [
        "MIG-ffda444c-c706-57c6-98c9-67c441a0b109", "MIG-fe9bc608-60f5-5479-8cc4-1827021d27a9"]
    assert found["GPU-838f60d9-651f-9166-ea42-f9da674a6947"][0].profile == "1g.5gb"
    assert found["GPU-e109d8d9-923e-7235-0429-96b7fdbcbd30"] == []


def test_mig_mode_rows_by_sysfs_address():
    rows = ("00000000:4F:00.0, GPU-838f60d9-651f-9166-ea42-f9da674a6947, Enabled\n"
            "00000000:00:04.0, GPU-e109d8d9-923e-7235-0429-96b7fdbcbd30, [N/A]\n"
            "WARNING: infoROM is corrupted at gpu 00000000:00:04.0\n")
    modes = gpu_modes.parse_modes(rows)
    assert modes["0000:4f:00.0"].mig and not modes["0000:00:04.0"].mig
    assert len(modes) == 2


def test_cc_status_and_ready_state():
    assert gpu_modes.cc_on("CC status: ON\n") and not gpu_modes.cc_on("CC status: OFF\n")
    assert gpu_modes.cc_ready("Confidential Compute GPUs Ready state: ready\n")
    assert not gpu_modes.cc_ready("Confidential Compute GPUs Ready state: not-ready\n")


def test_compute_apps_by_gpu():
    apps = gpu_modes.parse_apps("4242, python3, 00000000:00:04.0\n")
    assert apps == {"0000:00:04.0": ["python3 (pid 4242)"]}
