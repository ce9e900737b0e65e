import os

import pytest

from installer.base.errors import UsageError
from installer.host.hostroot import HostRoot


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


# -- writes and bounded reads: chroot semantics, never outside the root


@pytest.fixture
def outside(tmp_path_factory):
    """A directory outside the host root: nothing may ever land here."""
    return tmp_path_factory.mktemp("outside")


def test_write_through_absolute_dir_symlink_stays_inside(root, outside):
    os.symlink(str(outside), root.root / "run")  # absolute: means <root><outside> on the host
    written = root.write_atomic("/run/nvidia/validations/driver-ready", "X=1\n")
    assert written == root.root / str(outside).lstrip("/") / "nvidia/validations/driver-ready"
    assert written.read_text() == "X=1\n"
    assert list(outside.iterdir()) == []


def test_write_follows_a_final_symlink_inside_and_keeps_it(root):
    (root.root / "etc/alternatives").mkdir()
    (root.root / "etc/alternatives/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    os.symlink("/etc/alternatives/ld.so.conf", root.root / "etc/ld.so.conf")
    root.write_atomic("/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n/x\n")
    assert os.readlink(root.root / "etc/ld.so.conf") == "/etc/alternatives/ld.so.conf"
    assert (root.root / "etc/alternatives/ld.so.conf").read_text().endswith("/x\n")


def test_mkdir_and_unlink_resolve_parents_inside(root, outside):
    os.symlink(str(outside), root.root / "var")
    made = root.mkdir("/var/lib/cos-tools")
    assert made.is_dir() and made.is_relative_to(root.root)
    os.symlink(str(outside / "victim"), root.root / "etc/link")
    (outside / "victim").write_text("keep")
    assert root.unlink("/etc/link") is True  # the link goes, never its target
    assert (outside / "victim").read_text() == "keep"
    assert root.unlink("/etc/link") is False
    assert list(p.name for p in outside.iterdir()) == ["victim"]


def test_reads_refuse_fifos_devices_and_huge_files(root):
    from installer.base.errors import UnsupportedHostError

    os.mkfifo(root.root / "etc/lsb-release")
    with pytest.raises(UnsupportedHostError, match="is a FIFO"):
        root.read_text("/etc/lsb-release")
    os.symlink("/dev/zero", root.root / "etc/zero")
    (root.root / "dev").mkdir()
    os.symlink("/dev/zero", root.root / "dev/zero")  # a loop back to itself, inside the root
    with pytest.raises(UsageError, match="too many symlinks"):
        root.read_text("/etc/zero")
    with open(root.root / "etc/big", "wb") as f:
        f.truncate(400 << 20)  # sparse: costs no disk
    with pytest.raises(UnsupportedHostError, match="more than"):
        root.read_text("/etc/big")


def test_a_killed_runs_temp_file_does_not_block_the_next_write(root, tmp_path):
    """In a pod's PID namespace every run has the same pid: a temp file named by the pid,
    left by a SIGKILLed run, made each later firmware copy fail with EEXIST (seen as a
    flaky test_crash_safety run). The temp name is random now."""
    (tmp_path / "lib/firmware/updates").mkdir(parents=True)
    (tmp_path / f"lib/firmware/updates/.gsp.bin.{os.getpid()}.tmp").write_text("half")
    root.write_atomic("/lib/firmware/updates/gsp.bin", b"whole")
    assert (tmp_path / "lib/firmware/updates/gsp.bin").read_bytes() == b"whole"
