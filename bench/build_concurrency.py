"""Build concurrency: NVIDIA's kernel module build (make -jN) gets the CPUs the container
may use, not the host's.

    python bench/build_concurrency.py [--json-out FILE]

1. ``installer.jail.cpus.usable_cpus()`` against fake cgroup trees (v2 quota
   at the namespace root, v2 quota on an ancestor seen through
   /proc/self/cgroup, v1 CFS quota, no quota) next to ``os.cpu_count()``.
2. End to end (root only): a fresh install in the pod-like chroot with a fake
   cgroup fs mounted over the container's /sys/fs/cgroup (cpu.max = 1 CPU):
   the ``-jN`` our log says we passed to make, and the one the (fake) kbuild under
   NVIDIA's Makefile interface recorded receiving (kernel-build.log).

A reference installer runs ``nvidia-installer`` with its default
concurrency (its own make -jN), the host's CPU count: a 4-CPU pod on a 96-CPU node runs 96
compiler jobs and is throttled by its quota (CFS) for most of the build.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Row, print_rows, write_rows  # noqa: E402
from _fixture import CLI, can_run_pods, events, fixture  # noqa: E402


def _tree(root: Path, files: dict[str, str], self_cgroup: str) -> tuple[Path, Path]:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "self_cgroup").write_text(self_cgroup)
    return root / "fs", root / "self_cgroup"


def scenarios(work: Path) -> list[tuple[str, Path, Path, int]]:
    """(description, cgroup fs root, /proc/self/cgroup stand-in, expected CPUs)."""
    affinity = len(os.sched_getaffinity(0))
    out = []
    cases = [
        ("v2, cpu.max 1 CPU (container's own cgroup at the root)",
         {"fs/cpu.max": "100000 100000\n"}, "0::/\n", 1),
        ("v2, cpu.max 1.5 CPU (rounded up)",
         {"fs/cpu.max": "150000 100000\n"}, "0::/\n", min(affinity, 2)),
        ("v2, cpu.max max (no quota)", {"fs/cpu.max": "max 100000\n"}, "0::/\n", affinity),
        ("v2, host hierarchy, 1 CPU quota on the pod's parent",
         {"fs/kubepods/cpu.max": "100000 100000\n", "fs/kubepods/pod/ctr/cpu.max": "max 100000\n"},
         "0::/kubepods/pod/ctr\n", 1),
        ("v1, cfs_quota_us 50000 / 100000",
         {"fs/cpu/cpu.cfs_quota_us": "-1\n", "fs/cpu/cpu.cfs_period_us": "100000\n",
          "fs/cpu/docker/c1/cpu.cfs_quota_us": "50000\n",
          "fs/cpu/docker/c1/cpu.cfs_period_us": "100000\n"},
         "2:cpu,cpuacct:/docker/c1\n0::/\n", 1),
        ("v2, cpu.max 32 CPUs on a smaller host (affinity wins)",
         {"fs/cpu.max": "3200000 100000\n"}, "0::/\n", affinity),
    ]
    for i, (desc, files, me, want) in enumerate(cases):
        fs, self_cgroup = _tree(work / f"case{i}", files, me)
        out.append((desc, fs, self_cgroup, want))
    return out


def end_to_end(work: Path) -> dict:
    """A fresh install in the pod under a fake 1-CPU cgroup: the argv nvidia-installer got."""
    cgroup = work / "cgroupfs"
    cgroup.mkdir()
    (cgroup / "cpu.max").write_text("100000 100000\n")
    with fixture(work / "fx") as fx:
        fx.pod.cgroup_dir = cgroup
        res = fx.pod.timed([str(CLI), "install"])
        if res["rc"] != 0:
            raise SystemExit(f"fresh install failed: {res['stderr'][-3000:]}")
        ours = next((e.get("argv") for e in events(res["stderr"])
                     if e.get("event") == "kernel_modules_build_started"), None)
        # make's output (kept in the install dir): the fake kbuild prints the -jN it got.
        log = (fx.node.install_dir / "kernel-build.log").read_text(errors="replace")
    flag = [a for a in (ours or []) if re.fullmatch(r"-j\d+", a)]
    received = re.search(r"jobs: (-j\d+)", log)
    return {"logged": flag[0] if flag else None,
            "received": received.group(1) if received else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json-out", help="write the summary rows here (for run_all.py)")
    ap.add_argument("--no-pod", action="store_true", help="skip the end-to-end install")
    args = ap.parse_args(argv)
    from installer.driver.module_build import make_argv
    from installer.jail.cpus import usable_cpus
    from installer.kmod.headers import KernelTree

    work = Path(tempfile.mkdtemp(prefix="bench-build-", dir="/tmp"))
    try:
        host = os.cpu_count()
        ok = True
        print(f"os.cpu_count() = {host}; affinity = {len(os.sched_getaffinity(0))}; "
              f"this container: usable_cpus() = {usable_cpus()}")
        print(f"  {'cgroup':58} {'usable_cpus':>11} {'expected':>8}  argv flag")
        for desc, fs, me, want in scenarios(work):
            got = usable_cpus(fs, me)
            argv = make_argv("kernel", KernelTree(Path("/src"), Path("/src")), got)
            flag = next(a for a in argv if a.startswith("-j"))
            ok &= got == want and flag == f"-j{want}"
            print(f"  {desc:58} {got:>11} {want:>8}  {flag}")
        e2e = None
        why_not = "skipped (--no-pod)" if args.no_pod else can_run_pods()
        if why_not is None:
            e2e = end_to_end(work)
            ok &= e2e["logged"] == "-j1" == e2e["received"]
            print(f"end to end, pod with cpu.max = 1 CPU on a {host}-CPU host: we passed "
                  f"make {e2e['logged']}; kernel-build.log: received {e2e['received']}")
        else:
            print(f"end to end: not run: {why_not}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [Row(
        target="build concurrency = CPU quota",
        measured=(str(e2e["received"]) if e2e else "unit cases only"),
        baseline=f"host CPUs {host}",
        ratio="",
        met=ok,
        note=("pod with cpu.max 1 CPU; fake cgroup trees v1/v2 all match"
              if e2e else f"end-to-end {why_not}"),
        data={"e2e": e2e, "host_cpus": host},
    )]
    print()
    print_rows(rows)
    write_rows(rows, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
