"""Run every bench and print one table: target, measured, baseline, ratio, met?

    python bench/run_all.py [--full] [--only NAME ...] [--markdown]     (make bench)

Quick by default (a few minutes): smaller files, fewer runs. ``--full`` uses
the sizes the targets name: a 1 GiB download, the 300/600/50 MB COS artifacts,
more runs. Each bench runs in its own process, prints its own figures, and
hands its rows back as JSON; bench/download.py (throughput, RSS, resume) is
parsed from its output. Benches needing root (the pod-like chroot) say so in
the table instead of failing. Exits 1 when a bench fails to run (and, with
``--strict``, when a target is not met).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, Row, print_rows  # noqa: E402

BENCH = REPO / "bench"

# main before issue 40's start-up work, when every start-up imported requests, tenacity,
# zstandard and pyseccomp: cache_hit times it beside today's code, in the same run.
EARLIER_REF = "6750694"

# name -> (script, quick args, full args)
BENCHES = {
    "cache_hit": ("cache_hit.py", ["--runs", "7", "--help-runs", "15", "--compare-ref", EARLIER_REF],
                  ["--runs", "15", "--help-runs", "30", "--compare-ref", EARLIER_REF]),
    "download": ("download.py", ["--size-mb", "256", "--runs", "3"],
                 ["--size-mb", "1024", "--runs", "3"]),
    "parallel": ("parallel.py", ["--scale", "0.1", "--runs", "3"], ["--scale", "1", "--runs", "3"]),
    "build": ("build_concurrency.py", [], []),
    "staged_reboot": ("staged_reboot.py", ["--runs", "3"], ["--runs", "7"]),
    # Quick: the fixture .run (its "compile" is a stand-in); full: NVIDIA's real source.
    "bundle": ("bundle_install.py", ["--inputs", "fixture"], ["--inputs", "auto"]),
    "jail": ("jail_build.py", ["--runs", "5"], ["--runs", "11"]),
}


def _num(pattern: str, text: str) -> float | None:
    m = re.search(pattern, text, re.MULTILINE)
    return float(m.group(1)) if m else None


def download_rows(out: str, size_mb: str) -> list[Row]:
    """Rows from bench/download.py's printed figures (it has no JSON output)."""
    from installer.net.transfer import CHUNK_SIZE

    ratio = _num(r"^ratio ours/curl \(median\):\s+([\d.]+)", out)
    curl = _num(r"^curl -o \+ sha256sum\s+([\d.]+)", out)
    ours = _num(r"^download\(\) \(call\)\s+([\d.]+)", out)
    rss = _num(r"^our peak RSS:\s+([\d.]+)", out)
    missing = _num(r"missing (\d+) bytes", out)
    refetched = _num(r"re-fetched (\d+) bytes", out)
    rows = [
        Row(f"download >= 0.9x curl ({size_mb} MiB)",
            f"{ours:.0f} MB/s" if ours else "n/a", f"curl+sha256sum {curl:.0f} MB/s" if curl else "",
            f"{ratio:.2f}x" if ratio else "", ratio >= 0.9 if ratio else None),
        Row("download peak RSS <= 80 MB", f"{rss:.1f} MB" if rss else "n/a", "", "",
            rss <= 80 if rss else None),
    ]
    if missing is not None and refetched is not None:
        extra = refetched - missing
        rows.append(Row("resume at 90 %: re-fetch <= missing + 1 chunk",
                        f"{refetched / 1e6:.1f} MB", f"missing {missing / 1e6:.1f} MB",
                        f"{refetched / max(missing, 1):.3f}x",
                        refetched <= missing + CHUNK_SIZE,
                        f"{extra:+.0f} bytes vs missing; chunk {CHUNK_SIZE} bytes"))
    else:
        rows.append(Row("resume at 90 %", "n/a", "", "", None, "no resume figure in the output"))
    return rows


def run(name: str, full: bool, tmp: Path) -> tuple[list[Row], float]:
    script, quick_args, full_args = BENCHES[name]
    path = BENCH / script
    args = full_args if full else quick_args
    if not path.exists():
        return [Row(name, "not run", "", "", None, f"bench/{script} is missing")], 0.0
    print(f"\n##### {script} {' '.join(args)}", flush=True)
    json_out = tmp / f"{name}.json"
    cmd = [sys.executable, str(path), *args]
    if name != "download":
        cmd += ["--json-out", str(json_out)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    rc = proc.wait()
    took = time.perf_counter() - t0
    out = "".join(lines)
    if rc != 0:
        return [Row(name, "failed", "", "", False, f"bench/{script} exited {rc}")], took
    if name == "download":
        size = args[args.index("--size-mb") + 1]
        return download_rows(out, size), took
    return [Row(**r) for r in json.loads(json_out.read_text())], took


def markdown(rows: list[Row]) -> str:
    out = ["| target | measured | baseline | ratio | met? |", "|---|---|---|---|---|"]
    for r in rows:
        met = "n/a" if r.met is None else ("yes" if r.met else "**no**")
        out.append(f"| {r.target} | {r.measured} | {r.baseline} | {r.ratio} | {met} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--full", action="store_true", help="the targets' sizes (1 GiB, 950 MB), more runs")
    ap.add_argument("--only", nargs="+", choices=list(BENCHES), help="run only these")
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a target is not met (default: only when a bench fails)")
    args = ap.parse_args(argv)
    names = args.only or list(BENCHES)
    rows: list[Row] = []
    took: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-run-all-") as tmp:
        for name in names:
            got, took[name] = run(name, args.full, Path(tmp))
            rows += got
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"\n===== summary ({'full' if args.full else 'quick'} run; "
          + ", ".join(f"{n} {t:.0f} s" for n, t in took.items())
          + f"; load average now {' '.join(load)})")
    print_rows(rows)
    if args.markdown:
        print()
        print(markdown(rows))
    if any(r.measured == "failed" for r in rows):
        return 1
    return 1 if args.strict and any(r.met is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
