"""Build jobs capped by the container's memory limit (issue 12: a 96-CPU node with a
4 GiB limit must not be OOM-killed mid-build)."""

from __future__ import annotations

from installer.jail.cgroup_memory import JOB_PEAK_BYTES, RESERVE_BYTES, jobs_for, memory_limit
from tests.unit.test_usable_cpus import _tree  # the same fake cgroup tree

GIB = 1 << 30


def test_96_cpus_under_4_gib_fit_the_limit():
    jobs = jobs_for(96, 4 * GIB)
    assert 1 <= jobs < 96
    assert jobs * JOB_PEAK_BYTES + RESERVE_BYTES <= 4 * GIB
    assert jobs_for(96, None) == 96
    assert jobs_for(4, 64 * GIB) == 4  # the CPUs are the cap
    assert jobs_for(8, 256 << 20) == 1  # never 0


def test_v2_limit_at_the_namespace_root(tmp_path):
    fs, me = _tree(tmp_path, {"fs/memory.max": f"{4 * GIB}\n"})
    assert memory_limit(fs, me) == 4 * GIB
    (fs / "memory.max").write_text("max\n")
    assert memory_limit(fs, me) is None


def test_v2_host_hierarchy_tightest_of_own_cgroup_and_ancestors(tmp_path):
    fs, me = _tree(tmp_path, {
        "fs/memory.max": "max\n",
        "fs/kubepods/pod1/memory.max": f"{3 * GIB}\n",
        "fs/kubepods/pod1/ctr/memory.max": f"{5 * GIB}\n",
    }, "0::/kubepods/pod1/ctr\n")
    assert memory_limit(fs, me) == 3 * GIB


def test_v1_memory_controller_and_its_no_limit_value(tmp_path):
    fs, me = _tree(tmp_path, {
        "fs/memory/memory.limit_in_bytes": "9223372036854771712\n",
        "fs/memory/kubepods/pod2/memory.limit_in_bytes": f"{2 * GIB}\n",
        "fs/cpu,cpuacct/kubepods/pod2/cpu.cfs_quota_us": "-1\n",
    }, "12:cpu,cpuacct:/kubepods/pod2\n7:memory:/kubepods/pod2\n")
    assert memory_limit(fs, me) == 2 * GIB
    (fs / "memory/kubepods/pod2/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert memory_limit(fs, me) is None


def test_no_cgroup_files_means_no_limit(tmp_path):
    assert memory_limit(tmp_path / "none", tmp_path / "none-self") is None
