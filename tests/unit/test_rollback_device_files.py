"""A failed run removes the device files it made, the ``nvidia-caps/`` dir included.

nvidia-modprobe -c and NVML (as root) make ``/dev/nvidia-caps/nvidia-cap1`` and
``nvidia-cap2`` in a dir of their own (the real H100 node: tests/data/gpu-node); the
rollback once unlinked that dir and failed with EISDIR (seen in the real-parts tier)."""

import os

from installer import rollback
from installer.records.journal import device_files


def _node_dev(tmp_path):
    dev = tmp_path / "dev"
    (dev / "char").mkdir(parents=True)
    (dev / "nvidiactl").touch()
    (dev / "char" / "195:255").symlink_to("../nvidiactl")
    return dev


def test_device_files_lists_the_caps_dir_and_its_files(tmp_path):
    dev = _node_dev(tmp_path)
    (dev / "nvidia-caps").mkdir()
    (dev / "nvidia-caps" / "nvidia-cap1").touch()
    (dev / "char" / "237:1").symlink_to("../nvidia-caps/nvidia-cap1")
    (dev / "char" / "8:0").symlink_to("../sda")
    assert device_files(dev) == {"nvidiactl", "char/195:255", "nvidia-caps",
                                 "nvidia-caps/nvidia-cap1", "char/237:1"}


def test_new_caps_dir_removed_with_its_files_old_files_kept(tmp_path):
    dev = _node_dev(tmp_path)
    before = device_files(dev)
    (dev / "nvidia0").touch()
    (dev / "nvidia-caps").mkdir()
    for cap in ("nvidia-cap1", "nvidia-cap2"):
        (dev / "nvidia-caps" / cap).touch()
    (dev / "char" / "237:1").symlink_to("../nvidia-caps/nvidia-cap1")
    rollback._remove_new_device_files(dev, before)
    assert sorted(os.listdir(dev)) == ["char", "nvidiactl"]
    assert os.listdir(dev / "char") == ["195:255"]


def test_files_new_in_an_old_caps_dir_go_the_dir_stays(tmp_path):
    dev = _node_dev(tmp_path)
    (dev / "nvidia-caps").mkdir()
    (dev / "nvidia-caps" / "nvidia-cap1").touch()
    before = device_files(dev)
    (dev / "nvidia-caps" / "nvidia-cap2").touch()
    rollback._remove_new_device_files(dev, before)
    assert os.listdir(dev / "nvidia-caps") == ["nvidia-cap1"]
