"""jail_limits.jail_cgroups's choices on fake cgroupfs trees (the real one: the attack tests
tests/attacks/test_jail_limits.py and test_jail_cgroups.py, on this machine's hybrid
hierarchy). The v2 steps follow Documentation/admin-guide/cgroup-v2.rst, "Threads": a
threaded controller (pids) is enabled in our cgroup's subtree_control although it holds
processes, and the children are made threaded."""

from __future__ import annotations

from pathlib import Path

from installer.jail import limits as jail_limits


def _self(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "self-cgroup"
    path.write_text(text)
    return path


def _hierarchy(root: Path, *own: str) -> Path:
    """A fake mounted hierarchy at ``root`` with our cgroup at ``own``."""
    root.mkdir(parents=True)
    (root / "cgroup.procs").write_text("")
    d = root.joinpath(*own)
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_v2_makes_threaded_children_with_pids_max_one_level_above_the_jail(tmp_path):
    root = tmp_path / "cg"
    _hierarchy(root)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    with jail_limits.jail_cgroups(99, "ndi", root, _self(tmp_path, "0::/\n")) as made:
        assert made.procs == [root / "ndi" / "jail" / "cgroup.procs"] and made.why_not == ""
        for d in (root / "ndi", root / "ndi" / "jail"):
            assert (d / "cgroup.type").read_text() == "threaded"
        assert (root / "ndi" / "pids.max").read_text() == "99"
        assert not (root / "ndi" / "jail" / "pids.max").exists()
        assert (root / "cgroup.subtree_control").read_text() == "+pids"
    assert (root / "cgroup.subtree_control").read_text() == "-pids"


def test_v1_makes_a_child_in_every_hierarchy_and_the_limit_on_the_pids_one(tmp_path):
    cg = tmp_path / "cg"
    pids = _hierarchy(cg / "pids", "pod", "ctr")
    memory = _hierarchy(cg / "memory", "pod", "ctr")
    cpu = _hierarchy(cg / "cpu,cpuacct", "pod", "ctr")
    cpuset = _hierarchy(cg / "cpuset", "pod", "ctr")
    for knob, value in (("cpuset.cpus", "0-3\n"), ("cpuset.mems", "0\n")):
        (cpuset / knob).write_text(value)
    systemd = _hierarchy(cg / "systemd", "pod", "ctr")
    self_cgroup = _self(tmp_path, "9:name=systemd:/pod/ctr\n6:cpuset:/pod/ctr\n"
                        "5:cpu,cpuacct:/pod/ctr\n4:memory:/pod/ctr\n3:pids:/pod/ctr\n0::/\n")
    with jail_limits.jail_cgroups(7, "ndi", cg, self_cgroup) as made:
        assert sorted(made.procs) == sorted(d / "ndi" / "jail" / "cgroup.procs"
                                            for d in (pids, memory, cpu, cpuset, systemd))
        assert (pids / "ndi" / "pids.max").read_text() == "7"
        assert (cpuset / "ndi" / "jail" / "cpuset.cpus").read_text() == "0-3"
        assert made.why_not == "" and made.shared == []


def test_without_a_pids_controller_the_reason_is_given(tmp_path):
    root = tmp_path / "cg"
    _hierarchy(root)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    with jail_limits.jail_cgroups(7, "ndi", root, _self(tmp_path, "0::/\n")) as made:
        assert "no pids cgroup controller" in made.why_not
        assert made.procs == [root / "ndi" / "jail" / "cgroup.procs"]  # a plain child still
    assert not (root / "ndi").exists()


def test_a_hierarchy_where_no_child_can_be_made_is_named(tmp_path):
    cg = tmp_path / "cg"
    pids = _hierarchy(cg / "pids", "ctr")
    (pids / "ndi").write_text("in the way")  # mkdir fails: EEXIST
    with jail_limits.jail_cgroups(7, "ndi", cg, _self(tmp_path, "3:pids:/ctr\n")) as made:
        assert made.procs == [] and "cannot make a pids cgroup" in made.why_not
        assert made.shared and str(pids) in made.shared[0]


def test_a_flat_v1_memory_cgroup_gives_its_limit_to_the_jails(tmp_path):
    cg = tmp_path / "cg"
    memory = _hierarchy(cg / "memory", "ctr")
    (memory / "memory.use_hierarchy").write_text("0\n")
    (memory / "memory.limit_in_bytes").write_text("4294967296\n")
    with jail_limits.jail_cgroups(7, "ndi", cg, _self(tmp_path, "4:memory:/ctr\n")) as made:
        assert (memory / "ndi" / "memory.limit_in_bytes").read_text() == "4294967296"
        assert made.procs == [memory / "ndi" / "jail" / "cgroup.procs"]


def test_two_jails_whose_pids_repeat_in_one_cgroup_are_both_bounded(tmp_path, monkeypatch):
    """Two installers in different PID namespaces but one cgroup (two test pods of one
    runner; a debugging run beside the pod's) have the same PID. The control: named by the
    PID alone, the second jail's child already exists and it runs without its pids bound."""
    root = tmp_path / "cg"
    _hierarchy(root)
    (root / "cgroup.controllers").write_text("pids\n")
    (root / "cgroup.subtree_control").write_text("")
    self_cgroup = _self(tmp_path, "0::/\n")
    monkeypatch.setattr(jail_limits.os, "getpid", lambda: 7)  # both PID namespaces' pid 7
    with jail_limits.jail_cgroups(99, "ndi-jail-7", root, self_cgroup) as first, \
            jail_limits.jail_cgroups(99, "ndi-jail-7", root, self_cgroup) as second:
        assert first.why_not == "" and "cannot make a pids cgroup" in second.why_not
    names = {jail_limits.cgroup_name() for _ in range(2)}
    assert len(names) == 2 and all(n.startswith("ndi-jail-7-") for n in names)
    a, b = sorted(names)
    with jail_limits.jail_cgroups(99, a, root, self_cgroup) as first, \
            jail_limits.jail_cgroups(99, b, root, self_cgroup) as second:
        assert first.why_not == second.why_not == ""
        assert (root / a / "pids.max").read_text() == (root / b / "pids.max").read_text() == "99"
