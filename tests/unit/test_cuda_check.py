"""installer.services.cuda_check's pure parts: which GPUs CUDA must see, and the words for a code."""

from __future__ import annotations

from installer.host import gpus
from installer.kmod.kernel import KernelState
from installer.services import cuda_check


def _gpu(root, addr, excluded: str | None) -> None:
    dev = root / "sys/bus/pci/devices" / addr
    dev.mkdir(parents=True)
    for name, value in (("vendor", "0x10de"), ("device", "0x2330"), ("class", "0x030200")):
        (dev / name).write_text(value + "\n")
    if excluded is not None:
        info = root / "proc/driver/nvidia/gpus" / addr / "information"
        info.parent.mkdir(parents=True)
        # nv-procfs.c's line; the real node's says "GPU Excluded:\t No" (gpu-node transcript B)
        info.write_text(f"Model: \t\t NVIDIA H100 80GB HBM3\nGPU Excluded:\t {excluded}\n")


def test_gpus_the_driver_excluded_are_not_expected(tmp_path):
    _gpu(tmp_path, "0000:00:06.0", "No")
    _gpu(tmp_path, "0000:00:07.0", "Yes")
    _gpu(tmp_path, "0000:00:08.0", None)  # no information file: counted
    switch = tmp_path / "sys/bus/pci/devices/0000:00:09.0"
    switch.mkdir()
    for name, value in (("vendor", "0x10de"), ("device", "0x22a3"), ("class", "0x068000")):
        (switch / name).write_text(value + "\n")
    kernel = KernelState(proc_dir=tmp_path / "proc", sys_dir=tmp_path / "sys")
    on_bus = gpus.scan(kernel.sys_dir)
    assert [g.address for g in on_bus] == ["0000:00:06.0", "0000:00:07.0", "0000:00:08.0"]
    assert cuda_check.expected_gpus(kernel, on_bus) == ["0000:00:06.0", "0000:00:08.0"]


def test_an_unknown_code_is_named_with_the_way_out():
    message, fix = cuda_check.explain("cuCtxCreate", 719, "CUDA_ERROR_LAUNCH_FAILED")
    assert message == "CUDA check: cuCtxCreate failed (719 CUDA_ERROR_LAUNCH_FAILED)"
    assert "Xid" in fix and "--skip-cuda-check" in fix


def test_every_explained_code_has_a_cause_and_a_fix():
    for code, failure in cuda_check.FAILURES.items():
        message, fix = cuda_check.explain("cuInit", code)
        assert f"returned {code} {failure.name}: " in message and fix == failure.fix
