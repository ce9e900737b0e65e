"""jail_limits.pids_cgroup's choices on fake cgroupfs trees (the real one: the attack test
tests/attacks/test_jail_limits.py, on this machine's hierarchy). The v2 steps follow
Documentation/admin-guide/cgroup-v2.rst, "Threads": a threaded controller (pids) is
enabled in our cgroup's subtree_control although it holds processes, and the child is
made threaded."""

from __future__ import annotations

from pathlib import Path

from installer import jail_limits


def _self(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "self-cgroup"
    path.write_text(text)
    return path


def test_v2_makes_a_threaded_child_with_pids_max_and_sets_our_cgroup_back(tmp_path):
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    with jail_limits.pids_cgroup(99, "jail", root, _self(tmp_path, "0::/\n")) as bound:
        assert bound.procs == root / "jail" / "cgroup.procs"
        assert (root / "jail" / "cgroup.type").read_text() == "threaded"
        assert (root / "jail" / "pids.max").read_text() == "99"
        assert (root / "cgroup.subtree_control").read_text() == "+pids"
    assert (root / "cgroup.subtree_control").read_text() == "-pids"


def test_v1_makes_a_child_in_our_pids_cgroup(tmp_path):
    own = tmp_path / "cg" / "pids" / "pod" / "ctr"
    own.mkdir(parents=True)
    self_cgroup = _self(tmp_path, "4:memory:/pod/ctr\n3:pids:/pod/ctr\n0::/\n")
    with jail_limits.pids_cgroup(7, "jail", tmp_path / "cg", self_cgroup) as bound:
        assert bound.procs == own / "jail" / "cgroup.procs"
        assert (own / "jail" / "pids.max").read_text() == "7"


def test_without_a_pids_controller_the_reason_is_given(tmp_path):
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory\n")
    with jail_limits.pids_cgroup(7, "jail", root, _self(tmp_path, "0::/\n")) as bound:
        assert bound.procs is None and "no pids cgroup controller" in bound.why_not
    assert not (root / "jail").exists()
