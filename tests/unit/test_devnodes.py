from installer import devnodes

INFO = ("Model: \t\t NVIDIA L4\nIRQ:   \t\t 35\nBus Location: \t 0000:00:05.0\n"
        "Device Minor: \t 3\nGPU Excluded:\t No\n")


def test_parse_device_minor():
    assert devnodes.parse_device_minor(INFO) == 3
    assert devnodes.parse_device_minor("Model: x\n") is None


def test_parse_params():
    text = "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 0\nRegistryDwords: \"\"\n"
    assert devnodes.parse_params(text) == {"ResmanDebugLevel": 4294967295, "ModifyDeviceFiles": 0}


def test_modify_allowed_prefers_the_loaded_driver_then_the_module_args():
    assert devnodes.modify_allowed("ModifyDeviceFiles: 0\n", ()) is False
    assert devnodes.modify_allowed("ModifyDeviceFiles: 1\n",
                                   ("nvidia.NVreg_ModifyDeviceFiles=0",)) is True
    assert devnodes.modify_allowed(None, ("nvidia.NVreg_ModifyDeviceFiles=0",)) is False
    assert devnodes.modify_allowed(None, ("nvidia_uvm.NVreg_ModifyDeviceFiles=0",)) is True
    assert devnodes.modify_allowed(None, ()) is True


def test_invocations_never_pass_gpu_minors_with_u():
    calls = devnodes.modprobe_invocations([0, 2])
    assert calls == [["-c255", "-c0", "-c2", "-m"], ["-c0", "-u"]]
    assert devnodes.expected_nodes([0, 2]) == [
        "nvidiactl", "nvidia0", "nvidia2", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools"]
    assert devnodes.Plan([0], modify=False).invocations == []
    assert "NVreg_ModifyDeviceFiles=0" in devnodes.Plan([0], modify=False).describe()


def test_gpu_minors_from_the_driver_else_the_pci_scan(tmp_path):
    from installer.kernel import KernelState

    k = KernelState(tmp_path / "proc", tmp_path / "sys", tmp_path / "dev")
    assert devnodes.gpu_minors(k) == [0]  # no GPU seen at all: still nvidia0
    for addr, minor in (("0000:00:05.0", 1), ("0000:00:04.0", 0)):
        info = tmp_path / "proc/driver/nvidia/gpus" / addr / "information"
        info.parent.mkdir(parents=True)
        info.write_text(f"Bus Location: \t {addr}\nDevice Minor: \t {minor}\n")
    assert devnodes.gpu_minors(k) == [0, 1]


def test_a_hung_nvidia_modprobe_is_said_to_have_timed_out(tmp_path, monkeypatch):
    """Issue 26: a hang read "failed:" with an empty cause; it names the timeout."""
    import pytest

    from installer.errors import VerifyError
    from installer.kernel import KernelState
    from installer.runner import Runner

    k = KernelState(tmp_path / "proc", tmp_path / "sys", tmp_path / "dev")
    k.dev_dir.mkdir()
    modprobe = tmp_path / "nvidia-modprobe"
    modprobe.write_text("#!/bin/sh\nexec sleep 30\n")  # silent, never returns
    modprobe.chmod(0o755)
    monkeypatch.setattr(devnodes, "TIMEOUT_S", 1)
    with pytest.raises(VerifyError) as err:
        devnodes.create(modprobe, k, Runner(), ())
    assert err.value.message == "nvidia-modprobe -c255 -c0 -m timed out after 1s"
