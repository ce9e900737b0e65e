"""The COS precompiled step reads and links in the extracted tree outside the jail: a link
the .run's code (its header, mkprecompiled) left where a dir belongs is refused."""

from __future__ import annotations

import pytest

from installer.base.errors import BuildError
from installer.distros.cos.precompiled import _check_dirs


def test_a_linked_precompiled_dir_is_refused(tmp_path):
    (tmp_path / "kernel/nvidia").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "kernel/precompiled").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(BuildError, match="/kernel/precompiled is a link"):
        _check_dirs(tmp_path)


def test_real_dirs_pass(tmp_path):
    for rel in ("kernel/precompiled", "kernel/nvidia", "kernel/nvidia-modeset"):
        (tmp_path / rel).mkdir(parents=True)
    _check_dirs(tmp_path)
