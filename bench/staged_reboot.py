"""After a reboot, installing the version staged for it vs a cache hit (issue 23).

    python bench/staged_reboot.py [--runs 3] [--json-out FILE]

A fixture Ubuntu node (bench/_fixture.py: the pod-like chroot, fake kernel, makeself .run
over HTTPS on 127.0.0.1). Each run: driver A installed and held by a workload, driver B
asked for with WHEN_IN_USE=stage (B built and kept in .next-boot; not timed); then a
"reboot" (``FakeKernel.unload_all``) and B's install from .next-boot (timed: no download,
no build), then another reboot and B's cache hit (timed, the baseline). The staged install
does what a cache hit does plus moving the staged tree in, its record check, the staged
loads from .staging and the promote: the target is at most 2x the cache hit.

Needs root (mount namespaces), like ``make demo``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Row, Stats, print_rows, write_rows  # noqa: E402
from _fixture import CLI, VERSION, can_run_pods, fixture  # noqa: E402

STAGED = "535.183.01"  # B: the version staged while VERSION (A) is in use
TARGET_RATIO = 2.0


def _install(pod, version: str, plan: str, status_file: Path, **env: str) -> float:
    res = pod.timed([str(CLI), "install"], env={"NVIDIA_DRIVER_VERSION": version, **env})
    if res["rc"] != 0:
        raise SystemExit(f"install of {version} failed: {res['stderr'][-3000:]}")
    status = json.loads(status_file.read_text())
    if status["plan"] != plan:
        raise SystemExit(f"install of {version}: plan {status['plan']}, expected {plan}")
    return res["wall_s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    if (why := can_run_pods()) is not None:
        print(f"skipped: {why}")
        return 0
    staged_s: list[float] = []
    hit_s: list[float] = []
    with tempfile.TemporaryDirectory(prefix="ndi-bench-staged-") as tmp, \
            fixture(Path(tmp), also_serve=(STAGED,)) as fx:
        node, kernel, pod = fx.node, fx.kernel, fx.pod
        status_file = node.install_dir / "status.json"
        for _ in range(args.runs):
            kernel.unload_all()  # a reboot
            _install(pod, VERSION, "fresh", status_file)
            kernel.hold("nvidia")
            _install(pod, STAGED, "staged", status_file, WHEN_IN_USE="stage")
            kernel.unhold("nvidia")
            kernel.unload_all()  # a reboot
            staged_s.append(_install(pod, STAGED, "fresh", status_file))
            kernel.unload_all()  # a reboot
            hit_s.append(_install(pod, STAGED, "cached", status_file))
    staged, hit = Stats.of(staged_s), Stats.of(hit_s)
    ratio = staged.median / hit.median
    print(f"after a reboot ({args.runs} runs; s: median min max)")
    print(f"  staged version installed: {staged.median:.2f} {staged.min:.2f} {staged.max:.2f}")
    print(f"  cache hit (baseline):     {hit.median:.2f} {hit.min:.2f} {hit.max:.2f}")
    rows = [Row(f"staged-reboot install <= {TARGET_RATIO:.0f}x a cache hit",
                f"{staged.median:.2f} s", f"cache hit {hit.median:.2f} s", f"{ratio:.2f}x",
                ratio <= TARGET_RATIO, "no download, no build: the tree staged before the reboot")]
    print()
    print_rows(rows)
    write_rows(rows, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
