"""Device files after install, made by NVIDIA's real nvidia-modprobe (the fixture payload's
launcher runs Debian's binary against the fake kernel) and checked by the fake NVML."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from installer.kmod import devnodes
from tests.fixtures.fakekmod import CAPS_MAJOR, UVM_MAJOR
from tests.integration.conftest import V1, V2
from tests.pod import events, last_event, ok, reboot_then_cached_install

NV_MAJOR = 195


def expected(minors: list[int], modeset: bool = False) -> dict[str, tuple[int, int]]:
    """Exactly these character devices: one per GPU, the control, the UVM pair and, only
    with nvidia-modeset loaded (--display-modules), modeset's."""
    return {"nvidiactl": (NV_MAJOR, 255), **({"nvidia-modeset": (NV_MAJOR, 254)} if modeset else {}),
            **{f"nvidia{m}": (NV_MAJOR, m) for m in minors},
            "nvidia-uvm": (UVM_MAJOR, 0), "nvidia-uvm-tools": (UVM_MAJOR, 1)}


def assert_exact_nodes(kernel, gpu_count: int, modeset: bool = False) -> None:
    want = expected(list(range(gpu_count)), modeset)
    got = {n: d for n, d in kernel.devices().items() if n.startswith("nvidia")}
    assert got == want
    # verify's nvidia-smi (NVML, root) made the MIG capability files; dev_char_links linked them.
    caps = {f"{CAPS_MAJOR}:{m}": f"../nvidia-caps/nvidia-cap{m}" for m in (1, 2)}
    assert kernel.char_links() == {f"{ma}:{mi}": f"../{n}" for n, (ma, mi) in want.items()} | caps
    calls = kernel.calls("nvidia-modprobe")[-2:]
    assert [c["argv"] for c in calls] == [
        ["-c255", *(f"-c{m}" for m in range(gpu_count)), *(["-m"] if modeset else [])],
        ["-c0", "-u"]]
    assert all(c["rc"] == 0 for c in calls)


def add_gpus(kernel, count: int) -> None:
    for n in range(1, count):  # the kernel fixture has one at 0000:00:04.0
        kernel.add_gpu(f"0000:00:{4 + n:02x}.0")


@pytest.mark.parametrize("gpu_count", [1, 2, 8])
def test_fresh_install_makes_exactly_the_device_files(node, pod, kernel, server, gpu_count):
    add_gpus(kernel, gpu_count)
    ok(pod.run("install"))
    assert_exact_nodes(kernel, gpu_count)


def test_display_modules_add_the_modeset_file(node, pod, kernel, server):
    ok(pod.run("install", env={"NVIDIA_DISPLAY_MODULES": "1"}))
    assert_exact_nodes(kernel, 1, modeset=True)


def test_reboot_cached_load_makes_them_again(node, pod, kernel, server):
    add_gpus(kernel, 2)
    ok(pod.run("install"))
    reboot_then_cached_install(pod, kernel, server)
    assert_exact_nodes(kernel, 2)


@pytest.mark.parametrize("old_driver", ["gone after a reboot", "loaded and unused"])
def test_upgrade_keeps_exactly_the_device_files(node, pod, kernel, server, old_driver):
    """In place (no reboot), the old driver's files are still there when the upgrade
    unloads it and loads V2: they must end up exactly the set, as nvidia-modprobe makes it."""
    add_gpus(kernel, 2)
    ok(pod.run("install"))
    if old_driver == "gone after a reboot":
        kernel.unload_all()
    else:
        assert_exact_nodes(kernel, 2)  # V1's, present while V1 is unloaded
    modprobe_calls = len(kernel.calls("nvidia-modprobe"))
    proc = ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2}))
    assert kernel.loaded()["nvidia"].version == V2
    unloaded = [e for e in events(proc.stderr) if e.get("event") == "old_driver_unloaded"]
    assert len(unloaded) == (old_driver == "loaded and unused")
    assert len(kernel.calls("nvidia-modprobe")) == modprobe_calls + 2  # this run's, both rc 0
    assert_exact_nodes(kernel, 2)


def test_modify_device_files_0_makes_none_and_says_so(node, pod, kernel, server):
    proc = pod.run("install", "--module-arg", "nvidia.NVreg_ModifyDeviceFiles=0")
    assert proc.returncode == 9, proc.stderr[-2000:]
    final = last_event(proc)
    assert "NVreg_ModifyDeviceFiles=0" in final["error"] and "/dev/nvidiactl" in final["error"]
    assert not [n for n in kernel.devices() if n.startswith("nvidia")]
    assert kernel.calls("nvidia-modprobe") == []


def test_no_installer_code_makes_device_files_itself():
    """Only nvidia-modprobe (and NVML) make them: the installer never calls mknod."""
    src = Path(devnodes.__file__).parent
    offenders = [str(p) for p in src.rglob("*.py") if re.search(r"\bmknod\b\s*\(", p.read_text())]
    assert offenders == []


def test_only_nvidia_and_uvm_loaded_makes_their_files_and_no_modeset(driver_run, fake_kernel,
                                                                    monkeypatch, tmp_path):
    """The real H100 node (transcript sections B, E): nvidia and nvidia_uvm loaded, an empty
    /dev. The old step's `nvidia-modprobe -c255 -c0 -m` asked for nvidia-modeset, which
    NVIDIA's binary then tries to load, and failed; devnodes.create asks NVIDIA's real
    nvidia-modprobe (the payload's launcher) only for the loaded modules' files, after
    making /dev/char (without it Debian's binary exits 1: transcript section D)."""
    import shutil
    import subprocess

    from installer.host.runner import Runner
    from installer.kmod.kernel import KernelState
    from tests.fixtures.kernel import fake_ko

    fake_kernel.add_gpu()
    env = fake_kernel.subprocess_env()
    for name, stem, deps in (("nvidia", "nvidia", ()), ("nvidia_uvm", "nvidia-uvm", ("nvidia",))):
        ko = tmp_path / f"{stem}.ko"
        ko.write_bytes(fake_ko(name, fake_kernel.release, version=V1, depends=deps))
        subprocess.run(["insmod", str(ko)], env=env, check=True)
    nvidia_modprobe = driver_run.payload(V1) / "nvidia-modprobe"
    old = subprocess.run([nvidia_modprobe, "-c255", "-c0", "-m"], env=env, capture_output=True)
    assert old.returncode == 1  # the old argv: nvidia-modeset cannot be had
    for leftover in fake_kernel.dev_dir.iterdir():  # an empty tmpfs /dev, as on the node
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()

    fake_kernel.activate(monkeypatch)
    nodes = devnodes.create(nvidia_modprobe, KernelState(), Runner(env=KernelState().seam_env()), ())
    want = {"nvidiactl": (NV_MAJOR, 255), "nvidia0": (NV_MAJOR, 0),
            "nvidia-uvm": (UVM_MAJOR, 0), "nvidia-uvm-tools": (UVM_MAJOR, 1)}
    assert nodes == list(want)
    assert {n: d for n, d in fake_kernel.devices().items() if n.startswith("nvidia")} == want
    assert fake_kernel.char_links() == {f"{ma}:{mi}": f"../{n}" for n, (ma, mi) in want.items()}
    assert [c["argv"] for c in fake_kernel.calls("nvidia-modprobe")][-2:] == [
        ["-c255", "-c0"], ["-c0", "-u"]]
    assert "nvidia_modeset" not in fake_kernel.loaded()
