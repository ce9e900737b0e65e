"""Boot soak of the qemu tier's guest kernels (not part of CI: ``make soak-vm``).

Boots every guest kernel the tiers use (the 6.1 guest of tests/vm and the 6.12 guest of
tests/vm/test_r550.py) N times in a row through the same harness as the tests, each boot
running one step that prints the kernel's clock messages, and counts the boots whose
kernel crashed (before or after the payload started) or did not finish.

    .venv/bin/python -m tests.vm.soak [--boots 20] [--accel tcg,thread=single] [--smp 2]
        [--kernels 6.1,6.12] [--work SH] [--report FILE]

``--work SH`` adds a timed step (e.g. two CPU-bound processes at once, to see what a
guest's parallel work costs under an ``--accel``).

Exit 0 only when every boot finished without a crash. The report (Markdown) names the
conditions (qemu, accel, smp, host load), the boot times and every failure.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.vm import provision as prov
from tests.vm.harness import _CRASH, ACCEL, GuestVM, Step

CLOCK_STEP = Step("clock", "dmesg | grep -iE 'tsc|sched_clock|clocksource' | tail -n 20; nproc", timeout=120)


def guests(which: set[str]) -> dict[str, prov.VMAssets]:
    base = prov.provision()
    out = {}
    if "6.1" in which:
        out[base.abi] = base
    if "6.12" in which:
        from tests.realparts import newer_kernel as nk

        k = nk.newer_kernel()
        out[k.headers.abi] = prov.provision_extra_kernel(k.headers.abi, k.image_deb, k.headers.output, base)
    return out


def soak_one(assets: prov.VMAssets, args: argparse.Namespace, work: Path) -> dict:
    guest = GuestVM(assets, work / assets.abi, accel=args.accel, smp=args.smp)
    steps = [CLOCK_STEP] + ([Step("work", args.work, timeout=600)] if args.work else [])
    rows = []
    for i in range(args.boots):
        r = guest.boot(f"soak-{i + 1}", steps, timeout=900)
        crash = r.crashed_before_payload
        any_crash = _CRASH.search(r.serial)
        clock = r.steps["clock"].stdout if "clock" in r.steps else ""
        rows.append({"boot": i + 1, "seconds": r.seconds, "finished": r.finished,
                     "crash_before_payload": crash.splitlines()[0] if crash else "",
                     "crash": any_crash.group(0) if any_crash else "",
                     # __sched_clock_stable flipped at run time (a text_poke_bp of
                     # sched_clock_cpu: tests/vm/README.md, "Why single-threaded TCG")
                     "sched_clock_flip": "sched_clock: Marking " in clock,
                     "work_s": r.steps["work"].seconds if "work" in r.steps else None,
                     "log": str(r.serial_log)})
        print(f"{assets.abi} boot {i + 1}/{args.boots}: {r.seconds} s finished={r.finished} "
              f"crash={rows[-1]['crash'] or '-'} work={rows[-1]['work_s']}", flush=True)
    return {"abi": assets.abi, "rows": rows, "clock_sample": clock}


def report(results: list[dict], args: argparse.Namespace, started: str) -> str:
    qemu = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True).stdout
    lines = [f"# Boot soak: {args.boots} boots per guest kernel", "",
             f"- started {started}, host {platform.node()} ({os.cpu_count()} CPUs, load average at "
             f"the end {os.getloadavg()[0]:.1f}), {qemu.splitlines()[0] if qemu else 'qemu ?'}",
             f"- `-accel {args.accel} -smp {args.smp} -machine pc -cpu qemu64`"
             + (f"; `--work`: `{args.work}`" if args.work else ""), "",
             "| guest kernel | boots | finished | kernel crashes | before user space | "
             "boot time median (min-max) s | sched_clock key flipped |",
             "|---|---|---|---|---|---|---|"]
    for res in results:
        rows = res["rows"]
        secs = [r["seconds"] for r in rows]
        lines.append(
            f"| {res['abi']} | {len(rows)} | {sum(r['finished'] for r in rows)} | "
            f"{sum(bool(r['crash']) for r in rows)} | {sum(bool(r['crash_before_payload']) for r in rows)} | "
            f"{statistics.median(secs):.1f} ({min(secs):.1f}-{max(secs):.1f}) | "
            f"{sum(r['sched_clock_flip'] for r in rows)} |")
        work = [r["work_s"] for r in rows if r["work_s"] is not None]
        if work:
            lines.append(f"|   `--work` step | | | | | {statistics.median(work):.1f} "
                         f"({min(work):.1f}-{max(work):.1f}) | |")
    for res in results:
        for r in res["rows"]:
            if r["crash"] or not r["finished"]:
                why = r["crash"] or "did not finish"
                lines.append(f"- {res['abi']} boot {r['boot']}: {why} ({r['log']})")
    for res in results:
        lines += ["", f"The clock messages of the last {res['abi']} boot (the `clock` step):", "",
                  "```", res["clock_sample"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--boots", type=int, default=20)
    ap.add_argument("--accel", default=ACCEL)
    ap.add_argument("--smp", type=int, default=2)
    ap.add_argument("--kernels", default="6.1,6.12")
    ap.add_argument("--work", help="a shell step timed in every boot")
    ap.add_argument("--report", type=Path)
    args = ap.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results = []
    # The serial logs stay (a crash must be readable afterwards); the disks go.
    work = Path(tempfile.mkdtemp(prefix="ndi-soak-", dir=os.environ.get("NDI_VM_KEEP")))
    for assets in guests(set(args.kernels.split(","))).values():
        results.append(soak_one(assets, args, work))
    for disk in work.glob("*/root.qcow2"):
        disk.unlink()
    text = report(results, args, started) + f"\nSerial logs: {work}\n"
    print(text)
    if args.report:
        args.report.write_text(text)
    bad = sum(bool(r["crash"]) or not r["finished"] for res in results for r in res["rows"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
