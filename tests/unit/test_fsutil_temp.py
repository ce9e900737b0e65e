"""installer.base.fsutil.write_atomic's temp file, made without tempfile (which a cache hit
no longer imports): mkstemp's guarantees, held here (CPython Lib/tempfile.py, _mkstemp_inner:
O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600, a new random name on EEXIST)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from installer.base import fsutil


def test_the_temp_file_is_new_private_and_beside_the_target(tmp_path: Path):
    fd, name = fsutil.new_temp_file(tmp_path / "status.json")
    try:
        made = Path(name)
        assert made.parent == tmp_path and made.name.startswith(".status.json.")
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
        assert os.get_inheritable(fd) is False
    finally:
        os.close(fd)
    second_fd, second = fsutil.new_temp_file(tmp_path / "status.json")
    os.close(second_fd)
    assert second != name  # random each time: a killed run's leftover blocks nothing


def test_a_link_planted_at_the_name_is_never_followed(tmp_path: Path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    names = iter([b"\x00" * 8, b"\x01" * 8])
    monkeypatch.setattr(fsutil.os, "urandom", lambda n: next(names))
    (tmp_path / f".status.json.{'00' * 8}.tmp").symlink_to(victim)
    fd, name = fsutil.new_temp_file(tmp_path / "status.json")  # the next name instead
    os.close(fd)
    assert name.endswith(f".{'01' * 8}.tmp")
    assert victim.read_text() == "keep"


def test_no_free_name_is_a_clear_error_not_a_loop(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(fsutil.os, "urandom", lambda n: b"\x00" * n)
    (tmp_path / f".status.json.{'00' * 8}.tmp").write_text("left by a killed run")
    with pytest.raises(FileExistsError, match="no free temporary name beside status.json"):
        fsutil.new_temp_file(tmp_path / "status.json")


def test_write_atomic_leaves_only_the_target(tmp_path: Path):
    fsutil.write_atomic(tmp_path / "a" / "status.json", '{"ok": true}', mode=0o640)
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["status.json"]
    assert stat.S_IMODE((tmp_path / "a" / "status.json").stat().st_mode) == 0o640


def test_relative_to_a_directory_fd_as_the_host_root_writes(tmp_path: Path):
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd, name = fsutil.new_temp_file("gsp.bin", dir_fd=dir_fd)
        os.close(fd)
    finally:
        os.close(dir_fd)
    assert "/" not in name and name.startswith(".gsp.bin.")
    assert (tmp_path / name).is_file()
