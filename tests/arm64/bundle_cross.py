"""NVIDIA's real arm64 535 modules built by ``bundle build --arch arm64`` on this amd64
machine, as a fleet's CI would build them (issue 42 §2).

Why a cross build and not a native one under emulation: a native arm64 build here would
run gcc (and NVIDIA's conftest.sh, hundreds of compiler runs) under qemu's TCG on two
shared cores, many times slower than the cross build's native amd64 gcc emitting aarch64
code; and the cross build is what an amd64 CI builds for an Arm fleet anyway.

The .run (``NVIDIA-Linux-aarch64-<V>.run``, makeself with NVIDIA's ``-x``, as
tests/realparts/runfile.py packs the x86_64 one) holds Debian's arm64 module tree
(``kernel-open/`` from nvidia-open-kernel-source 535.261.03, or ``kernel/`` from
nvidia-kernel-source 535.309.01), Debian's arm64 ``nvidia-smi``, ``libnvidia-ml.so`` and
``nvidia-modprobe`` (535.309.01: named for the .run's version in the 535.261.03 one: no
test runs them), and the stand-in nvidia-installer (tests/realparts/nvidia-installer: a
Python script, so this machine runs it without qemu-user; NVIDIA's aarch64 one needs
binfmt_misc, installer/driver/nvidia_run.py ``check_runs_here``).

The CLI runs in a private mount namespace in which the arm64 headers (and the amd64
linux-kbuild their ``scripts`` link to) sit at Debian's paths (their Makefiles name each
other by absolute path): a tmpfs over /usr/src and a bind over /usr/lib/linux-kbuild-<X>,
gone with the namespace. Bundles are cached by content: the parts' versions, the .run,
the cross compiler and the installer's files that make the cross build what it is
(tests/arm64/shaping.py); ``NDI_ARM64_NO_CACHE=1`` builds again.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.arm64 import shaping
from tests.arm64.provision import CACHE_ROOT, CrossParts, default_log
from tests.fixtures.nvidia_options import option_table
from tests.fixtures.runfile import STOCK_HEADER, pack_run
from tests.realparts import cache
from tests.realparts.runfile import STANDIN

REPO = Path(__file__).resolve().parents[2]
CC = "aarch64-linux-gnu-gcc-12"  # what Debian's .kernelvariables names: $(CROSS_COMPILE)gcc-12
BUILD_TIMEOUT_S = 2700  # one cold build: 17.4 min measured at load 9-11 on 2 cores
# zstd level 3: level 19 (the default, smallest for the nodes) took over 7 min for the open
# bundle on the loaded 2-core machine; the format is the same at every level.
COMPRESSION_LEVEL = "3"
FLAVORS = {"open": "kernel-open", "proprietary": "kernel"}
RECIPE = "1"  # of the .run and the bundle build below: bump when either changes
# The installer's part in the bundles' key: the files that make the cross build what it
# is (tests/arm64/shaping.py; tests/unit/test_shaping_arm64.py holds the list). Other installer
# changes do not rebuild (a cold build is 2 x 5-20 min here, past the tier's CI budget);
# the default tier runs ``bundle build`` on every run, and the guest always runs this tree.
shaping_key = shaping.source_hash


def run_name(version: str) -> str:
    return f"NVIDIA-Linux-aarch64-{version}.run"


def _version(parts: CrossParts, module_type: str) -> str:
    pkg = {"open": "nvidia-open-kernel-source", "proprietary": "nvidia-kernel-source"}
    return parts.versions[f"{pkg[module_type]}:arm64"].split("-")[0]


def build_run(parts: CrossParts, module_type: str) -> Path:
    """The cached aarch64 .run of one module type."""
    version = _version(parts, module_type)
    tree = parts.open_tree if module_type == "open" else parts.proprietary_tree
    user = parts.userspace
    smi = user / "usr/lib/nvidia/current/nvidia-smi"
    nvml = next((user / "usr/lib/aarch64-linux-gnu/nvidia/current").glob("libnvidia-ml.so.5*"))
    inputs = {FLAVORS[module_type]: tree, "nvidia-smi": smi, "nvidia-modprobe":
              user / "usr/bin/nvidia-modprobe", f"libnvidia-ml.so.{version}": nvml,
              "nvidia-installer": STANDIN}
    table = option_table(version)
    k = cache.key("arm64-run", version, {n: cache.content_hash(p, ("debian",))
                                         for n, p in inputs.items()}, table,
                  cache.file_hash(STOCK_HEADER), RECIPE)

    def produce(work: Path) -> None:
        payload = work / f"NVIDIA-Linux-aarch64-{version}"
        for name, src in inputs.items():
            if src.is_dir():
                shutil.copytree(src, payload / name, symlinks=True,
                                ignore=shutil.ignore_patterns("debian"))
            else:
                payload.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, payload / name)
                (payload / name).chmod(0o755)
        (payload / ".version").write_text(version + "\n")
        (payload / ".build-directory").write_text(FLAVORS[module_type] + "\n")
        (payload / ".options.json").write_text(json.dumps({"for_version": version, **table}))
        pack_run(payload, work / run_name(version), version, "--sha256", "--xz",
                 "--complevel", "1", "--threads", "0", "--tar-quietly", "--noprogress")
        shutil.rmtree(payload)

    return cache.cached_dir(CACHE_ROOT / "runs", k, produce) / run_name(version)


def _namespace_script(parts: CrossParts, argv: list[str]) -> str:
    """Mounts putting the cached headers at Debian's paths, then ``argv``."""
    lines = ["set -e", "mount -t tmpfs -o size=1m tmpfs /usr/src"]
    for d in (parts.source, parts.output):
        lines += [f"mkdir -p {d}", f"mount --bind {parts.root}{d} {d}"]
    lines += [f"mkdir -p {parts.kbuild} 2>/dev/null || true",
              f"mount --bind {parts.root}{parts.kbuild} {parts.kbuild}",
              "exec " + shlex.join(argv)]
    return "\n".join(lines)


def bundle_build(parts: CrossParts, module_type: str, log=default_log) -> tuple[Path, dict]:
    """(the bundle's directory, its build record: seconds, rc, the CLI's JSON) for one
    module type, cached by content."""
    run = build_run(parts, module_type)
    version = _version(parts, module_type)
    compiler = subprocess.run([CC, "--version"], capture_output=True, text=True).stdout
    k = cache.key("arm64-bundle", parts.versions, module_type, cache.file_hash(run), compiler,
                  shaping_key(), RECIPE)
    done = CACHE_ROOT / "bundles" / k
    if (done / "record.json").is_file() and os.environ.get("NDI_ARM64_NO_CACHE") != "1":
        return done, json.loads((done / "record.json").read_text())
    shutil.rmtree(done, ignore_errors=True)
    out = done.with_name(k + ".tmp")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    argv = [sys.executable, "-m", "installer", "bundle", "build", "--host-root", "/",
            "--output-dir", str(out), "--arch", "arm64", "--kernel-release", parts.abi,
            "--kernel-source-path", parts.output, "--driver-version", version,
            "--driver-url", f"file://{run}", "--kernel-module-type", module_type,
            "--compression-level", COMPRESSION_LEVEL, "--log-format", "json"]
    log(f"bundle build --arch arm64 ({module_type}, {version}): a cold cross build, minutes")
    t0 = time.monotonic()
    proc = subprocess.run(["timeout", str(BUILD_TIMEOUT_S), "unshare", "--mount",
                           "--propagation", "private", "--", "sh", "-c",
                           _namespace_script(parts, argv)],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    seconds = round(time.monotonic() - t0, 1)
    log(f"bundle build exited {proc.returncode} after {seconds} s")
    if proc.returncode != 0:
        raise AssertionError(f"bundle build --arch arm64 ({module_type}) failed "
                             f"(rc {proc.returncode}):\n{proc.stderr[-5000:]}")
    record = {"seconds": seconds, "rc": proc.returncode, "cli": json.loads(proc.stdout)}
    (out / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    os.replace(out, done)
    return done, record


def elf_machine(path: Path) -> str:
    """readelf's name for the file's machine (``AArch64``)."""
    out = subprocess.run(["readelf", "-h", str(path)], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(r"^\s*Machine:\s+(.+)$", out, re.M)
    if not m:
        raise AssertionError(f"readelf -h {path}: no Machine line\n{out}")
    return m.group(1).strip()


def modinfo(ko: Path, field: str) -> str:
    return subprocess.run(["modinfo", "-F", field, str(ko)], capture_output=True, text=True,
                          check=True).stdout.strip()
