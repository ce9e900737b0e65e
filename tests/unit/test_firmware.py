"""GSP firmware placement: firmware_class.path when free or ours, else the host's
/lib/firmware/updates, else a clear stop (linux drivers/base/firmware_loader/main.c)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from installer.base.errors import ModuleLoadError
from installer.host.hostroot import HostRoot
from installer.host.installdir import InstallDir
from installer.kmod import firmware
from installer.kmod.kernel import KernelState

VERSION = "535.261.03"
GSP = (f"nvidia/{VERSION}/gsp_ga10x.bin", f"nvidia/{VERSION}/gsp_tu10x.bin")
INSTALL_HOST = PurePosixPath("/home/kubernetes/bin/nvidia")


class Node:
    def __init__(self, tmp: Path, param: str | None = "") -> None:
        self.host = HostRoot(tmp / "host")
        (tmp / "host/proc/sys/kernel").mkdir(parents=True)
        (tmp / "host/proc/sys/kernel/osrelease").write_text("6.1.0-56-amd64\n")
        self.kernel = KernelState(tmp / "host/proc", tmp / "host/sys", tmp / "host/dev")
        self.param = tmp / "host/sys" / firmware.PATH_PARAM
        if param is not None:
            self.param.parent.mkdir(parents=True)
            self.param.write_text(param + "\n")
        self.install = InstallDir(self.host.path(INSTALL_HOST), INSTALL_HOST)
        for name in GSP:
            f = self.install.firmware / name
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(b"GSP" + name.encode())

    def place(self, tree=None):
        return firmware.make_findable(self.kernel, self.host, self.install, tree or self.install)


def test_unset_path_is_pointed_at_the_install(tmp_path):
    node = Node(tmp_path)
    assert not firmware.findable(node.kernel, node.host, node.install)[0]
    placed = node.place()
    assert placed.how == "firmware_class.path"
    # Written without a newline: the loader uses the parameter verbatim.
    assert node.param.read_text() == f"{INSTALL_HOST}/firmware"
    ok, detail = firmware.findable(node.kernel, node.host, node.install)
    assert ok, detail


def test_staging_then_live_dir(tmp_path):
    node = Node(tmp_path)
    staging = node.install.new_staging()
    for name in GSP:
        (staging.firmware / name).parent.mkdir(parents=True, exist_ok=True)
        (staging.firmware / name).write_bytes(b"new")
    node.place(staging)
    assert node.param.read_text() == f"{INSTALL_HOST}/.staging/firmware"
    node.place()  # after promote: ours, so it is moved back to the live dir
    assert node.param.read_text() == f"{INSTALL_HOST}/firmware"


def test_someone_elses_path_is_kept_and_files_go_to_lib_firmware_updates(tmp_path):
    node = Node(tmp_path, param="/opt/vendor/firmware")
    placed = node.place()
    assert placed.how == "copied"
    assert node.param.read_text().strip() == "/opt/vendor/firmware"
    for name in GSP:
        copied = node.host.path("/lib/firmware/updates") / name
        assert copied.read_bytes() == (node.install.firmware / name).read_bytes()
    assert firmware.findable(node.kernel, node.host, node.install)[0]


def test_someone_elses_path_and_read_only_lib_firmware_stop_clearly(tmp_path):
    node = Node(tmp_path, param="/opt/vendor/firmware")
    lib = node.host.path("/lib")
    lib.mkdir(parents=True)
    (lib / "firmware").write_text("not a dir: writes under it fail like a read-only root")
    with pytest.raises(ModuleLoadError) as err:
        node.place()
    assert "'/opt/vendor/firmware', set by someone else" in err.value.message
    assert "/lib/firmware/updates is not writable" in err.value.message


def test_a_path_too_long_for_the_parameter_is_not_written(tmp_path):
    long_dir = PurePosixPath("/" + "d" * 250)
    node = Node(tmp_path)
    node.install = InstallDir(node.host.path(long_dir), long_dir)
    for name in GSP:
        (node.install.firmware / name).parent.mkdir(parents=True, exist_ok=True)
        (node.install.firmware / name).write_bytes(b"x")
    assert node.place().how == "copied"
    assert node.param.read_text() == "\n"


def test_no_firmware_nothing_to_do(tmp_path):
    node = Node(tmp_path)
    for name in GSP:
        (node.install.firmware / name).unlink()
    assert node.place().how == "none"
    assert node.param.read_text() == "\n"
    assert firmware.findable(node.kernel, node.host, node.install)[0]
