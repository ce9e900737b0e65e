import os

import pytest

from installer.errors import UsageError
from installer.hostroot import HostRoot


@pytest.fixture
def root(tmp_path):
    (tmp_path / "usr/src/linux-headers-5.15").mkdir(parents=True)
    (tmp_path / "usr/src/linux-headers-5.15/Makefile").write_text("x")
    (tmp_path / "lib/modules/5.15").mkdir(parents=True)
    # Absolute, as on real nodes: must resolve inside the root, not on this machine.
    os.symlink("/usr/src/linux-headers-5.15", tmp_path / "lib/modules/5.15/build")
    os.symlink("../../../../../../../etc", tmp_path / "lib/modules/5.15/climb")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/os-release").write_text("ID=ubuntu\n")
    return HostRoot(tmp_path)


def test_absolute_symlink_resolves_inside_root(root):
    assert root.resolve("/lib/modules/5.15/build/Makefile") == (
        root.root / "usr/src/linux-headers-5.15/Makefile")


def test_symlink_climbing_out_is_clamped_at_root(root):
    assert root.resolve("/lib/modules/5.15/climb/os-release") == root.root / "etc/os-release"
    assert root.read_text("/lib/modules/5.15/climb/os-release") == "ID=ubuntu\n"


def test_literal_escape_is_refused(root):
    with pytest.raises(UsageError, match="escapes the host root"):
        root.path("/../../etc/passwd")


def test_path_and_host_view_round_trip(root):
    p = root.path("/etc/os-release")
    assert p == root.root / "etc/os-release"
    assert str(root.host_view(p)) == "/etc/os-release"


def test_symlink_loop_is_an_error(root):
    os.symlink("/loop", root.root / "loop")
    with pytest.raises(UsageError, match="too many symlinks"):
        root.resolve("/loop/x")


def test_missing_file_reads_default(root):
    assert root.read_text("/etc/lsb-release") is None
