"""Issue 38 item 7: the GPU tier read-only by construction, proved here without a GPU.

Every command the tier runs (the installer's CLI -- verify, doctor -- and nvidia-smi, the
snapshot's included) runs through tests/gpu/launch.py in a mount namespace of its own: /dev
a tmpfs holding copies of the node's NVIDIA device files, module tools and every
nvidia-modprobe bind-mounted over by a refusing stub. These tests run the launcher on this
machine with stand-ins for what only a GPU node has, and check the node's own /dev and the
install dir are untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.gpu import launch
from tests.gpu.node import GpuNode, child_env, cli, dev_listing, launcher

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare(1) for mount namespaces")
CANARY = "nvidia-ndi-tier-canary"


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _node(tmp_path: Path) -> GpuNode:
    """An install dir whose nvidia-modprobe and nvidia-smi try to change the node: the
    modprobe would leave a file behind; the smi stand-in runs it, asks modprobe to load a
    module, makes a device file, and prints what it sees."""
    inst = tmp_path / "inst"
    _script(inst / "bin/nvidia-modprobe", f"touch {tmp_path}/nvidia-modprobe-ran\n")
    smi = _script(inst / "bin/nvidia-smi", f"""
{inst}/bin/nvidia-modprobe -c 0 -u
modprobe nvidia_uvm
: > /dev/{CANARY}
awk '$5 == "/dev" {{print "dev_fs=" $(NF-2)}}' /proc/self/mountinfo | tail -1
echo "mnt_ns=$(stat -L -c %i /proc/self/ns/mnt)"
echo "0000:00:04.0, Disabled"
""")
    (inst / "lib64").mkdir()
    return GpuNode(inst, "a test's", smi, [], False)


def test_nvidia_smi_runs_on_the_read_only_view_and_changes_nothing(tmp_path):
    node = _node(tmp_path)
    before = dev_listing(Path("/dev"))
    proc = node.smi_run("--query-gpu=pci.bus_id,persistence_mode", "--format=csv,noheader")
    assert "dev_fs=tmpfs" in proc.stdout, proc
    assert f"mnt_ns={os.stat('/proc/self/ns/mnt').st_ino}" not in proc.stdout, proc
    # nvidia-modprobe and modprobe: the refusing stub, not the programs.
    assert "nvidia-modprobe -c 0 -u refused (read-only)" in proc.stderr, proc.stderr
    assert "modprobe nvidia_uvm refused (read-only)" in proc.stderr, proc.stderr
    assert not (tmp_path / "nvidia-modprobe-ran").exists()
    assert not Path("/dev", CANARY).exists()  # made in the tmpfs, gone with it
    assert dev_listing(Path("/dev")) == before


def test_the_snapshot_lists_dev_and_the_install_dir_before_running_anything(tmp_path):
    node = _node(tmp_path)
    snap = node.snapshot()
    assert list(snap) == ["dev", "modules", "params", "install_dir", "smi"]
    assert CANARY not in snap["dev"] and not Path("/dev", CANARY).exists()
    assert snap["install_dir"]["bin/nvidia-smi"].startswith("-rwxr-xr-x ")
    assert snap["smi"]["persistence_mode"].endswith("0000:00:04.0, Disabled")
    (node.install_dir / "lib64/libnew.so").write_text("")  # what the end snapshot must see
    assert "lib64/libnew.so" in node.snapshot()["install_dir"]


def test_the_installers_cli_runs_in_the_private_namespace(tmp_path):
    inst = _node(tmp_path).install_dir
    res = cli("doctor", "--install-dir", str(inst), "--help")
    assert res.returncode == 0, res.describe()
    assert "Usage: nvidia-driver-installer doctor" in res.stdout
    ns = res.namespace
    assert ns["dev_fs"] == "tmpfs" and ns["mnt_ns"] != os.stat("/proc/self/ns/mnt").st_ino, ns
    assert str((inst / "bin/nvidia-modprobe").resolve()) in ns["stubbed"], ns
    for tool in ("/sbin/modprobe", "/usr/sbin/modprobe", "/sbin/insmod", "/usr/sbin/rmmod"):
        if os.path.exists(tool):
            assert os.path.realpath(tool) in ns["stubbed"], (tool, ns)
    assert ns["dev"] == dev_listing(Path("/dev"))  # copies of the node's NVIDIA files, links
    assert ns["module_calls"] == []


def test_the_cli_launcher_refuses_outside_a_namespace_of_its_own():
    own = json.dumps({"parent_mnt_ns": os.stat("/proc/self/ns/mnt").st_ino})
    without = {k: v for k, v in child_env().items() if k != launch.NS_ENV}
    for env in (without, child_env(**{launch.NS_ENV: own})):
        proc = subprocess.run(launcher("cli", "--help"), capture_output=True, text=True,
                              cwd=ROOT, timeout=60, env=env)
        assert proc.returncode == 3, proc
        assert "refused" in proc.stderr and "Usage" not in proc.stdout, proc.stderr


def test_the_node_device_files_are_read_as_they_are(tmp_path):
    """What the tmpfs gets copies of: the node's mode, owner and device numbers (probe3.sh's
    ``copy``), character devices only."""
    dev = tmp_path / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    os.mknod(dev / "nvidiactl", 0o20666, os.makedev(195, 255))
    os.chmod(dev / "nvidiactl", 0o666)  # past the umask
    os.mknod(dev / "nvidia-caps/nvidia-cap1", 0o20400, os.makedev(237, 1))
    (dev / "nvidia-not-a-device").write_text("")
    (dev / "char").mkdir()
    (dev / "char/195:255").symlink_to("../nvidiactl")
    (dev / "char/1:3").symlink_to("../null")
    assert launch.node_char_links(dev) == [("195:255", "../nvidiactl")]
    assert launch.node_device_files(dev) == [
        ("nvidia-caps/nvidia-cap1", 0o400, 0, 0, os.makedev(237, 1)),
        ("nvidiactl", 0o666, 0, 0, os.makedev(195, 255))]
