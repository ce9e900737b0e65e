"""Run a real-parts .run's nvidia-installer on this machine, leaving the machine as it was.

NVIDIA's installer writes to fixed system paths (/usr/lib/x86_64-linux-gnu,
/usr/bin, /lib/firmware, which Debian's merged /usr puts under /usr). So it
runs in a private mount namespace (``unshare --mount``) with an overlay over
/usr whose upper dir is ours: whatever it installs there lands in
``<work>/upper/usr`` and vanishes from view when the namespace ends (the
namespace's mounts die with it, even when the run fails). Module
install path and log file are pointed into ``<work>`` by option.

``cached_install()`` keeps the outcome (exit status, output, the captured
files, the built tree's modules and kbuild .cmd files) keyed by the archive's
content, the headers and the arguments: a rerun skips the 2-minute build.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.realparts import cache
from tests.realparts.kbuild import Headers, compiler_id, prune_build
from tests.realparts.provision import default_log

RESULT = "result.json"


def run_with_usr_overlay(argv: list[str], upper: Path, *, cwd: Path | None = None,
                         timeout: float | None = None) -> subprocess.CompletedProcess:
    """argv with /usr (and /lib, unless it links into /usr) overlaid: writes go to upper/."""
    mounts = []
    for top in ("usr", "lib"):
        if Path("/", top).is_symlink():
            continue  # merged /usr: /lib is usr/lib
        (upper / top).mkdir(parents=True, exist_ok=True)
        (upper / f".work-{top}").mkdir(exist_ok=True)  # on the upper dir's filesystem, as overlay needs
        mounts.append(f"mount -t overlay overlay -o lowerdir=/{top},upperdir={upper}/{top},"
                      f"workdir={upper}/.work-{top} /{top}; ")
    script = "set -e; mount --make-rprivate /; " + "".join(mounts) + 'exec "$@"'
    return subprocess.run(["unshare", "--mount", "--", "sh", "-c", script, "sh", *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def install_args(work: Path, headers: Headers, source: Path, output: Path | None, jobs: int) -> list[str]:
    """What the tests pass: the modules and the log go to work/, the rest to NVIDIA's paths."""
    args = ["--silent", "--no-systemd", f"--kernel-source-path={source}"]
    if output is not None:
        args.append(f"--kernel-output-path={output}")
    return args + [f"--kernel-name={headers.abi}", f"--kernel-install-path={work}/modules",
                   f"--log-file-name={work}/nvidia-installer.log", f"--concurrency-level={jobs}"]


def cached_install(run: Path, headers: Headers, source: Path, output: Path | None,
                   jobs: int = 0, log=default_log) -> Path:
    """``sh <run> --target <work>/pkg <install_args>``, once; the work dir, with result.json.

    Work dir: pkg/kernel*/ (the build dirs, pruned to kbuild's .cmd files and conftest/),
    upper/usr (what it installed under /usr), modules/, nvidia-installer.log."""
    jobs = jobs or os.cpu_count() or 1
    k = cache.key("standin", cache.content_hash(run), headers.packages, compiler_id(),
                  install_args(Path("WORK"), headers, source, output, 0))

    def produce(work: Path) -> None:
        argv = ["sh", str(run), "--target", str(work / "pkg"),
                *install_args(work, headers, source, output, jobs)]
        log(f"running {run.name}'s nvidia-installer (a build takes about 2 minutes)")
        t0 = time.monotonic()
        cp = run_with_usr_overlay(argv, work / "upper", cwd=work, timeout=1800)
        seconds = round(time.monotonic() - t0, 1)
        log(f"nvidia-installer exited {cp.returncode} after {seconds} s")
        if cp.returncode < 0:  # killed (the run was stopped): not a result to cache
            raise RuntimeError(f"nvidia-installer was killed by signal {-cp.returncode}")
        for item in (work / "pkg").iterdir():  # the rest is in the .run; the modules in modules/
            if item.name in ("kernel", "kernel-open"):
                prune_build(item)
                for ko in item.rglob("*.ko"):
                    ko.unlink()
            elif item.is_dir():
                shutil.rmtree(item)
            else:
                item.unlink()
        (work / RESULT).write_text(json.dumps({
            "argv": argv, "work": str(work), "rc": cp.returncode, "stdout": cp.stdout,
            "stderr": cp.stderr, "seconds": seconds}, indent=1) + "\n")

    return cache.cached_dir("installs", k, produce)


def result(work: Path) -> dict:
    return json.loads((work / RESULT).read_text())
