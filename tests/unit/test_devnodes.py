from installer.kmod import devnodes
from installer.kmod.moduleargs import ModuleArg

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
    def args(text):
        return (ModuleArg.parse(text),)

    assert devnodes.modify_allowed("ModifyDeviceFiles: 1\n",
                                   args("nvidia.NVreg_ModifyDeviceFiles=0")) is True
    assert devnodes.modify_allowed(None, args("nvidia.NVreg_ModifyDeviceFiles=0")) is False
    assert devnodes.modify_allowed(None, args("nvidia_uvm.NVreg_ModifyDeviceFiles=0")) is True
    assert devnodes.modify_allowed(None, ()) is True


def test_invocations_never_pass_gpu_minors_with_u():
    all3 = ("nvidia", "nvidia_uvm", "nvidia_modeset")
    calls = devnodes.modprobe_invocations([0, 2], all3)
    assert calls == [["-c255", "-c0", "-c2", "-m"], ["-c0", "-u"]]
    assert devnodes.expected_nodes([0, 2], all3) == [
        "nvidiactl", "nvidia0", "nvidia2", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools"]
    assert devnodes.Plan([0], modify=False).invocations == []
    assert "NVreg_ModifyDeviceFiles=0" in devnodes.Plan([0], modify=False).describe()


def test_only_the_loaded_modules_files_are_asked_for():
    """The real H100 node loads nvidia and nvidia_uvm only: `-m` made nvidia-modprobe try to
    load nvidia-modeset and exit 1 (transcript section E). No -m, no nvidia-modeset there."""
    assert devnodes.modprobe_invocations([0], ("nvidia", "nvidia_uvm")) == [
        ["-c255", "-c0"], ["-c0", "-u"]]
    assert devnodes.expected_nodes([0], ("nvidia", "nvidia_uvm")) == [
        "nvidiactl", "nvidia0", "nvidia-uvm", "nvidia-uvm-tools"]
    assert devnodes.modprobe_invocations([0], ("nvidia",)) == [["-c255", "-c0"]]
    assert devnodes.expected_nodes([1], ("nvidia",)) == ["nvidiactl", "nvidia1"]
    assert devnodes.modprobe_invocations([0], ()) == []


def _kernel(tmp_path, loaded=("nvidia", "nvidia_uvm")):
    from installer.kmod.kernel import KernelState

    k = KernelState(tmp_path / "proc", tmp_path / "sys", tmp_path / "dev")
    k.dev_dir.mkdir()
    k.proc_dir.mkdir()
    (k.proc_dir / "modules").write_text("".join(
        f"{m} 1830912 - - Live 0xffffffffc080c000 (O)\n" for m in loaded))
    for m in loaded:
        (k.sys_dir / "module" / m).mkdir(parents=True)
        (k.sys_dir / "module" / m / "initstate").write_text("live\n")
    return k


def _recording_modprobe(tmp_path, fail_on=None):
    """Records its argv; makes nothing (the test makes the files); fails with 1 on an argv
    containing ``fail_on`` as Debian's nvidia-modprobe does for a module it cannot load."""
    log = tmp_path / "argv.log"
    script = tmp_path / "nvidia-modprobe"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\n'
                      + (f'case " $* " in *" {fail_on} "*) exit 1;; esac\n' if fail_on else "")
                      + 'test -d "${NVIDIA_INSTALLER_DEV_DIR:-/dev}/char" || exit 1\n')
    script.chmod(0o755)
    return script, log


def test_create_asks_for_and_requires_only_the_loaded_modules_files(tmp_path):
    import os

    from installer.host.runner import Runner

    k = _kernel(tmp_path)
    modprobe, log = _recording_modprobe(tmp_path, fail_on="-m")
    for name in ("nvidiactl", "nvidia0", "nvidia-uvm", "nvidia-uvm-tools"):
        (k.dev_dir / name).touch()  # stand-ins: nvidia-modprobe's own work is tested elsewhere
    nodes = devnodes.create(modprobe, k, Runner(env=k.seam_env()), ())
    assert nodes == ["nvidiactl", "nvidia0", "nvidia-uvm", "nvidia-uvm-tools"]
    assert log.read_text().splitlines() == ["-c255 -c0", "-c0 -u"]
    assert (k.dev_dir / "char").is_dir() and not os.path.exists(k.dev_dir / "nvidia-modeset")


def test_create_makes_dev_char_before_nvidia_modprobe(tmp_path):
    """Debian's nvidia-modprobe 535.309.01 exits 1 in a /dev without char/ (transcript
    section D; symlink_char_dev)."""
    import pytest

    from installer.base.errors import VerifyError
    from installer.host.runner import Runner

    k = _kernel(tmp_path)
    modprobe, log = _recording_modprobe(tmp_path)
    with pytest.raises(VerifyError) as err:  # files missing, but nvidia-modprobe ran fine
        devnodes.create(modprobe, k, Runner(env=k.seam_env()), ())
    assert log.read_text().splitlines() == ["-c255 -c0", "-c0 -u"]
    assert err.value.message.startswith("device files missing after nvidia-modprobe: "
                                        "/dev/nvidiactl, /dev/nvidia0, /dev/nvidia-uvm")


def test_a_failed_call_names_the_loaded_modules_not_modeset(tmp_path):
    import pytest

    from installer.base.errors import VerifyError
    from installer.host.runner import Runner

    k = _kernel(tmp_path)
    modprobe, _ = _recording_modprobe(tmp_path, fail_on="-u")
    with pytest.raises(VerifyError) as err:
        devnodes.create(modprobe, k, Runner(env=k.seam_env()), ())
    assert err.value.message == "nvidia-modprobe -c0 -u exited with 1"
    assert "nvidia, nvidia_uvm" in err.value.hint and "modeset" not in err.value.hint


def test_with_modeset_loaded_it_asks_for_its_file_too(tmp_path):
    from installer.host.runner import Runner

    k = _kernel(tmp_path, ("nvidia", "nvidia_uvm", "nvidia_modeset"))
    modprobe, log = _recording_modprobe(tmp_path)
    for name in ("nvidiactl", "nvidia0", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools"):
        (k.dev_dir / name).touch()
    assert "nvidia-modeset" in devnodes.create(modprobe, k, Runner(env=k.seam_env()), ())
    assert log.read_text().splitlines() == ["-c255 -c0 -m", "-c0 -u"]


def test_create_refuses_when_nvidia_is_not_loaded(tmp_path):
    import pytest

    from installer.base.errors import VerifyError
    from installer.host.runner import Runner

    k = _kernel(tmp_path, ())
    modprobe, log = _recording_modprobe(tmp_path)
    with pytest.raises(VerifyError, match="the nvidia module is not loaded"):
        devnodes.create(modprobe, k, Runner(env=k.seam_env()), ())
    assert not log.exists()


def test_gpu_minors_from_the_driver_else_the_pci_scan(tmp_path):
    from installer.kmod.kernel import KernelState

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

    from installer.base.errors import VerifyError
    from installer.host.runner import Runner

    k = _kernel(tmp_path)
    modprobe = tmp_path / "nvidia-modprobe"
    modprobe.write_text("#!/bin/sh\nexec sleep 30\n")  # silent, never returns
    modprobe.chmod(0o755)
    monkeypatch.setattr(devnodes, "TIMEOUT_S", 1)
    with pytest.raises(VerifyError) as err:
        devnodes.create(modprobe, k, Runner(env=k.seam_env()), ())
    assert err.value.message == "nvidia-modprobe -c255 -c0 timed out after 1s"
