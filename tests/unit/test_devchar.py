"""/dev/char/<major>:<minor> links for NVIDIA nodes, on a dev dir with real char devices."""

from __future__ import annotations

import os
import stat

import pytest

from installer.kmod import devchar

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of char devices needs root")


def mknod(path, major, minor, mode=0o666):
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)


@pytest.fixture
def dev(tmp_path):
    d = tmp_path / "dev"
    mknod(d / "nvidiactl", 195, 255)
    mknod(d / "nvidia0", 195, 0)
    mknod(d / "nvidia-uvm", 511, 0)
    mknod(d / "nvidia-uvm-tools", 511, 1)
    mknod(d / "nvidia-caps/nvidia-cap1", 237, 1, 0o400)
    mknod(d / "null", 1, 3)
    (d / "nvidia-notadevice").write_text("")  # a regular file: ignored
    return d


def test_devices_found_with_numbers_and_modes(dev):
    found = {d.rel: (d.major, d.minor, d.mode) for d in devchar.nvidia_char_devices(dev)}
    assert found == {
        "nvidiactl": (195, 255, 0o666), "nvidia0": (195, 0, 0o666),
        "nvidia-uvm": (511, 0, 0o666), "nvidia-uvm-tools": (511, 1, 0o666),
        "nvidia-caps/nvidia-cap1": (237, 1, 0o400),
    }


def test_create_links_every_nvidia_node_relatively(dev):
    changed = devchar.create(dev)
    assert sorted(changed) == ["195:0", "195:255", "237:1", "511:0", "511:1"]
    assert os.readlink(dev / "char/195:0") == "../nvidia0"
    assert os.readlink(dev / "char/237:1") == "../nvidia-caps/nvidia-cap1"
    # Each link reaches the device it is named after.
    for link in (dev / "char").iterdir():
        st = link.stat()
        assert f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" == link.name
    assert not (dev / "char/1:3").exists()  # not ours to create


def test_create_is_idempotent(dev):
    devchar.create(dev)
    before = {p.name: p.lstat().st_ino for p in (dev / "char").iterdir()}
    assert devchar.create(dev) == []
    assert {p.name: p.lstat().st_ino for p in (dev / "char").iterdir()} == before
    assert not [p for p in (dev / "char").iterdir() if p.name.startswith(".")]


def test_wrong_link_is_replaced(dev):
    (dev / "char").mkdir()
    os.symlink("../nvidia7", dev / "char/195:0")
    states = {s.device.link_name: s.problem for s in devchar.check(dev)}
    assert states["195:0"] == "points to ../nvidia7"
    assert states["195:255"] == "missing"
    devchar.create(dev)
    assert os.readlink(dev / "char/195:0") == "../nvidia0"
    assert all(s.problem is None for s in devchar.check(dev))


def test_absolute_links_from_nvidia_ctk_are_accepted(dev):
    (dev / "char").mkdir()
    os.symlink("/dev/nvidia0", dev / "char/195:0")
    states = {s.device.link_name: s.problem for s in devchar.check(dev)}
    assert states["195:0"] is None


def test_remove_takes_only_nvidia_links(dev):
    devchar.create(dev)
    os.symlink("../null", dev / "char/1:3")
    removed = devchar.remove(dev)
    assert sorted(removed) == ["195:0", "195:255", "237:1", "511:0", "511:1"]
    assert [p.name for p in (dev / "char").iterdir()] == ["1:3"]


def test_remove_nodes_takes_only_nvidia_char_devices(dev):
    removed = devchar.remove_nodes(dev)
    assert sorted(removed) == ["nvidia-caps/nvidia-cap1", "nvidia-uvm", "nvidia-uvm-tools",
                               "nvidia0", "nvidiactl"]
    assert sorted(p.name for p in dev.iterdir()) == ["null", "nvidia-notadevice"]
    assert devchar.remove_nodes(dev) == []


def test_the_final_step_links_the_caps_files_nvml_made_after_device_nodes(dev):
    """On the real H100 node nvidia-smi (as root) made /dev/nvidia-caps/nvidia-cap1 (0400)
    and nvidia-cap2 (0444) during verify, after device_nodes had linked its files, so doctor's
    dev_char check failed our own install (transcript sections D, E). dev_char_links, the
    last step of every plan that verifies, links them; it leaves the modes as NVIDIA made them."""
    from types import SimpleNamespace

    from installer.kmod import devnodes
    from installer.steps import activate

    devnodes.link_char_devices(dev)  # what device_nodes did
    mknod(dev / "nvidia-caps/nvidia-cap2", 237, 2, 0o444)  # what NVML made afterwards
    assert [s.link.name for s in devchar.check(dev) if s.problem] == ["237:2"]
    step = activate.dev_char_links()
    step.run(SimpleNamespace(kernel=SimpleNamespace(dev_dir=dev)))
    assert all(s.problem is None for s in devchar.check(dev))
    assert os.readlink(dev / "char/237:2") == "../nvidia-caps/nvidia-cap2"
    assert stat.S_IMODE((dev / "nvidia-caps/nvidia-cap2").stat().st_mode) == 0o444


def test_dev_char_links_only_warns_when_it_cannot_link(dev, tmp_path):
    from types import SimpleNamespace

    from structlog.testing import capture_logs

    from installer.steps import activate

    (dev / "char").write_text("")  # not a directory: mkdir fails
    with capture_logs() as logs:
        activate.dev_char_links().run(SimpleNamespace(kernel=SimpleNamespace(dev_dir=dev)))
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["dev_char_links_failed"]
