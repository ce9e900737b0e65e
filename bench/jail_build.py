"""The build through the jail: no slower than before its bounds (issue 33).

    python bench/jail_build.py [--runs 5] [--baseline-ref abf8713] [--json-out FILE]

A fresh install of the fixture .run on a fixture Ubuntu node in the pod-like chroot,
``--runs`` times for each of two installer trees, alternating which goes first:

- ours: this checkout;
- baseline: ``--baseline-ref`` (default: main before issue 33: the jail without the
  read-only /proc knobs, the harvest through no link, the pids cgroup and the tmpfs
  sizes), unpacked with ``git archive`` into a temporary dir.

Each run is a child process whose ``sys.path`` starts with its tree, so the CLI, the
sandbox child and the test pod all come from that tree. The figure is the time of the
jail's steps, ``extract_driver`` + ``build_driver`` (the .run's header, make and
nvidia-installer in bwrap, the harvest), from the run's own ``step_finished`` events;
also the whole install's wall time. Needs root (mount namespaces), like ``make demo``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, Row, Stats, print_rows, write_rows  # noqa: E402

JAIL_STEPS = ("extract_driver", "build_driver")
BASELINE_REF = "abf8713"  # main before issue 33


def measure(tree: Path, work: Path) -> dict:
    """One fresh install with ``tree``'s installer (run in a child: see the docstring)."""
    sys.path.insert(0, str(tree))
    from _fixture import events, fixture

    with fixture(work) as fx:
        # The tree first on PYTHONPATH too: the fake kernel's start-up hook (sitecustomize,
        # on the pod's PYTHONPATH) imports installer.kmod.kernel before the interpreter puts the
        # working dir on sys.path, which made the baseline's runs the dev venv's installer
        # against the baseline's fixture .run (its libcuda has no cuDeviceGet: exit 9).
        path = os.pathsep.join(filter(None, (str(tree), fx.pod.env.get("PYTHONPATH"))))
        res = fx.pod.timed([sys.executable, "-m", "installer", "install"],
                           env={"PYTHONPATH": path})
    if res["rc"] != 0:
        raise SystemExit(f"install with {tree} failed: {res['stderr'][-3000:]}")
    steps = {e["step"]: e["duration_s"] for e in events(res["stderr"])
             if e.get("event") == "step_finished" and e.get("step") in JAIL_STEPS}
    if set(steps) != set(JAIL_STEPS):
        raise SystemExit(f"no {JAIL_STEPS} step events from {tree}: {sorted(steps)}")
    return {"jail_s": sum(steps.values()), "wall_s": res["wall_s"]}


def _child(tree: Path, work: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--measure", str(tree), "--work", str(work)],
                          capture_output=True, text=True, cwd=tree, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"run with {tree} failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _unpack(ref: str, into: Path) -> Path:
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "installer", "tests"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline-ref", default=BASELINE_REF)
    ap.add_argument("--json-out")
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # a child: one run with this tree
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(Path(args.measure), Path(args.work))))
        return
    from _fixture import can_run_pods

    if (why := can_run_pods()) is not None:
        rows = [Row("jail build no slower than before issue 33", "not run", "", "", None, why)]
        print_rows(rows)
        write_rows(rows, args.json_out)
        return
    with tempfile.TemporaryDirectory(prefix="bench-jail-") as tmp:
        trees = {"ours": REPO, "baseline": _unpack(args.baseline_ref, Path(tmp) / "baseline")}
        got: dict[str, list[dict]] = {name: [] for name in trees}
        for i in range(args.runs):
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            for name in order:
                got[name].append(_child(trees[name], Path(tmp) / f"{name}-{i}"))
    jail = {name: Stats.of([r["jail_s"] for r in runs]) for name, runs in got.items()}
    wall = {name: Stats.of([r["wall_s"] for r in runs]) for name, runs in got.items()}
    print(f"{'':30} {'median':>8} {'min':>8} {'max':>8}")
    for name in trees:
        print(f"jail steps, {name:18} {jail[name].fmt(unit='s', digits=3)}")
        print(f"whole install, {name:15} {wall[name].fmt(unit='s', digits=3)}")
    ratio = jail["ours"].median / jail["baseline"].median
    print(f"ratio ours/baseline (jail steps, median): {ratio:.2f}  ({args.runs} runs each, "
          f"baseline {args.baseline_ref})")
    # "No slower": within the run-to-run spread of the baseline itself.
    spread = jail["baseline"].max / jail["baseline"].median
    rows = [Row("jail build no slower than before issue 33", f"{jail['ours'].median:.3f} s",
                f"{args.baseline_ref} {jail['baseline'].median:.3f} s", f"{ratio:.2f}x",
                ratio <= spread, f"baseline's own max/median {spread:.2f}x",
                {"runs": args.runs})]
    print_rows(rows)
    write_rows(rows, args.json_out)


if __name__ == "__main__":
    main()
