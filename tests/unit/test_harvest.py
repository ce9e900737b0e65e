"""installer/jail/harvest.py: what is taken from a jail's output, and what is refused."""

from __future__ import annotations

import os

import pytest

from installer.jail import harvest


def _move(src, dst) -> int:
    s, d = harvest.open_dir(src), harvest.open_dir(dst)
    try:
        return harvest.move_tree(s, d, "/usr/lib/x86_64-linux-gnu")
    finally:
        os.close(s)
        os.close(d)


def test_files_dirs_and_links_inside_the_tree_move_as_they_are(tmp_path):
    src, dst = tmp_path / "upper", tmp_path / "lib64"
    (src / "gbm").mkdir(parents=True)
    dst.mkdir()
    (src / "libcuda.so.550.54.14").write_bytes(b"\x7fELF")
    os.symlink("libcuda.so.550.54.14", src / "libcuda.so.1")
    os.symlink("../libnvidia-allocator.so.1", src / "gbm/nvidia-drm_gbm.so")  # NVIDIA's own
    assert _move(src, dst) == 3
    assert (dst / "libcuda.so.550.54.14").read_bytes() == b"\x7fELF"
    assert os.readlink(dst / "libcuda.so.1") == "libcuda.so.550.54.14"
    assert os.readlink(dst / "gbm/nvidia-drm_gbm.so") == "../libnvidia-allocator.so.1"


@pytest.mark.parametrize("target", ["/etc/shadow", "../../etc", "a/../../x"])
def test_a_link_out_of_its_tree_is_refused(tmp_path, target):
    src, dst = tmp_path / "upper", tmp_path / "lib64"
    src.mkdir()
    dst.mkdir()
    os.symlink(target, src / "libx.so")
    with pytest.raises(harvest.Refused, match="libx.so is a link out of its tree"):
        _move(src, dst)


def test_a_fifo_is_refused_and_a_whiteout_skipped(tmp_path):
    src, dst = tmp_path / "upper", tmp_path / "lib64"
    src.mkdir()
    dst.mkdir()
    os.mknod(src / "gone.so", 0o600 | 0o020000, os.makedev(0, 0))  # overlayfs whiteout
    assert _move(src, dst) == 0 and not (dst / "gone.so").exists()
    os.mkfifo(src / "pipe")
    with pytest.raises(harvest.Refused, match="pipe is a FIFO"):
        _move(src, dst)


def test_a_linked_dir_on_the_way_is_refused_and_never_read(tmp_path):
    (tmp_path / "upper/var").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret/nvidia-installer.log").write_text("secret")
    os.symlink(tmp_path / "secret", tmp_path / "upper/var/log")
    with pytest.raises(harvest.Refused, match="/var/log is a link"):
        harvest.copy_regular(tmp_path / "upper", "var/log/nvidia-installer.log",
                             tmp_path / "copy")
    assert not (tmp_path / "copy").exists()
    assert harvest.read_head(tmp_path / "upper", "var/log/nvidia-installer.log", 10) is None
