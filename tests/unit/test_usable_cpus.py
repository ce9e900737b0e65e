"""usable_cpus: the build's concurrency follows the container's CPU quota, not the host's CPUs."""

from __future__ import annotations

import os
from pathlib import Path

from installer.driver.module_build import make_argv
from installer.jail.cpus import usable_cpus
from installer.kmod.headers import KernelTree

HOST = len(os.sched_getaffinity(0))


def _tree(root, files: dict[str, str], self_cgroup: str = "0::/\n"):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "self_cgroup").write_text(self_cgroup)
    return root / "fs", root / "self_cgroup"


def test_v2_quota_at_the_namespace_root(tmp_path):
    fs, me = _tree(tmp_path, {"fs/cpu.max": "100000 100000\n"})
    assert usable_cpus(fs, me) == 1
    (fs / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(fs, me) == HOST


def test_v2_quota_rounds_up_and_never_exceeds_affinity(tmp_path):
    fs, me = _tree(tmp_path, {"fs/cpu.max": "150000 100000\n"})
    assert usable_cpus(fs, me) == min(HOST, 2)
    (fs / "cpu.max").write_text(f"{(HOST + 8) * 100000} 100000\n")
    assert usable_cpus(fs, me) == HOST


def test_v2_host_hierarchy_own_cgroup_and_ancestors(tmp_path):
    # A privileged pod without a cgroup namespace sees the host's tree: the quota is on
    # its own cgroup (from /proc/self/cgroup) or a parent, not on the root.
    fs, me = _tree(tmp_path, {
        "fs/kubepods/pod1/cpu.max": "max 100000\n",
        "fs/kubepods/pod1/ctr/cpu.max": "max 100000\n",
        "fs/kubepods/cpu.max": "100000 100000\n",
    }, "0::/kubepods/pod1/ctr\n")
    assert usable_cpus(fs, me) == 1


def test_v1_quota(tmp_path):
    fs, me = _tree(tmp_path, {
        "fs/cpu/cpu.cfs_quota_us": "-1\n", "fs/cpu/cpu.cfs_period_us": "100000\n",
        "fs/cpu/docker/abc/cpu.cfs_quota_us": "50000\n",
        "fs/cpu/docker/abc/cpu.cfs_period_us": "100000\n",
    }, "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n")
    assert usable_cpus(fs, me) == 1


def test_no_cgroup_files_means_affinity(tmp_path):
    fs, me = _tree(tmp_path, {"fs/unrelated": ""})
    assert usable_cpus(fs, tmp_path / "missing") == HOST


def test_concurrency_reaches_the_installer_argv(tmp_path):
    fs, me = _tree(tmp_path, {"fs/cpu.max": "100000 100000\n"})
    tree = KernelTree(Path("/src"), Path("/src"))
    argv = make_argv("/x/kernel", tree, usable_cpus(fs, me))
    assert "-j1" in argv
