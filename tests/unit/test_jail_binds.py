"""What the build jail is shown of the kernel headers (nvidia_run.kernel_tree_binds) and
how bwrap is called (sandbox.bwrap_argv)."""

from __future__ import annotations

import os
from pathlib import Path

from installer.driver.nvidia_run import kernel_tree_binds
from installer.jail.run_in_jail import SandboxSpec, bwrap_argv
from installer.kmod.headers import KernelTree


def test_debian_split_headers_bind_the_kbuild_dir_their_links_lead_to(tmp_path):
    usr = tmp_path / "usr"
    common = usr / "src/linux-headers-6.1.0-56-common"
    output = usr / "src/linux-headers-6.1.0-56-amd64"
    kbuild = usr / "lib/linux-kbuild-6.1"
    for d in (common, output, kbuild / "scripts", kbuild / "tools"):
        d.mkdir(parents=True)
    os.symlink("../../lib/linux-kbuild-6.1/scripts", output / "scripts")
    os.symlink("../../lib/linux-kbuild-6.1/tools", output / "tools")
    os.symlink("/", output / "root-link")  # would show everything: never bound
    os.symlink("..", output / "up")  # an ancestor of the tree: never bound
    binds = kernel_tree_binds(KernelTree(common, output))
    assert binds == [(str(p), str(p)) for p in (common, output, kbuild / "scripts",
                                                kbuild / "tools")]


def test_an_unsplit_tree_is_one_bind(tmp_path):
    (tmp_path / "tree").mkdir()
    assert kernel_tree_binds(KernelTree(tmp_path / "tree", tmp_path / "tree")) == [
        (str(tmp_path / "tree"), str(tmp_path / "tree"))]


def test_bwrap_gets_no_capabilities_no_host_and_only_the_spec_binds(tmp_path):
    merged = tmp_path / "merged"
    (merged / "usr").mkdir(parents=True)
    (merged / "etc").mkdir()
    os.symlink("usr/bin", merged / "bin")
    (merged / "home").mkdir()  # not a system dir: not shown
    spec = SandboxSpec(workdir=str(tmp_path), argv=["make", "modules"], cwd="/x", env={},
                       binds=[("/hdr", "/hdr")], exec_binds=[],
                       log_file="", harvest_to="", output_file="", result_file="", pids_max=1,
                       rw_binds=[("/tree", "/x")])
    argv = bwrap_argv(merged, spec)
    words = " ".join(argv)
    assert argv[0] == "bwrap" and "--cap-drop ALL" in words
    for flag in ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--die-with-parent"):
        assert flag in argv
    assert "--unshare-user" not in argv  # root without capabilities, not a user namespace
    assert f"--bind {merged}/usr /usr" in words and "--symlink usr/bin /bin" in words
    assert "home" not in words and "--ro-bind /hdr /hdr" in words and "--bind /tree /x" in words
    assert "--proc /proc" in words and "--dev /dev" in words and "--ro-bind /sys /sys" in words
    assert argv[-3:] == ["--", "make", "modules"] and Path(argv[argv.index("--chdir") + 1]) == Path("/x")
