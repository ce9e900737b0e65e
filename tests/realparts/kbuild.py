"""NVIDIA's real kernel module build, run directly on this machine, and its cache.

- ``kernel_headers()``: this machine's Debian kernel headers, split the Debian
  way into a source dir (linux-headers-<X>-common, /lib/modules/<r>/source)
  and an output dir (linux-headers-<abi>, /lib/modules/<r>/build); the ABI is
  the qemu tier's (tests/vm/provision.py ``pick_abi``).
- ``direct_build()``: NVIDIA's Makefile as nvidia-installer drives it
  (kernel/Makefile takes SYSSRC and SYSOUT; with SYSOUT != SYSSRC it passes
  KBUILD_OUTPUT=$(SYSOUT) and NV_KERNEL_OUTPUT to Kbuild).
- ``cached_build()``: the same, once per (tree hash, headers package versions,
  make arguments, compiler): the 535 build takes about 2 minutes on 2 cores.
  The cache keeps the modules, every kbuild ``.<obj>.cmd``, conftest/ and the log.
- ``cached_objects()``: NVIDIA's Makefile's kbuild command with single-object goals
  (objects.mk): conftest and the named objects only, no modules (about 40 % of the
  CPU time of the whole 535 build), for the tests that read only kbuild's records.
- ``cmd_flags()``: the compiler flags kbuild recorded for one object, made
  comparable between two builds in different directories.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from tests.realparts import cache
from tests.realparts.provision import ProvisionError, default_log, run
from tests.vm import provision as vm_provision

BUILD_LOG = "ndi-build.log"
STATUS = "ndi-build.rc"  # make's exit status, in a cached result


class BuildError(RuntimeError):
    def __init__(self, message: str, log: Path) -> None:
        super().__init__(message)
        self.log = log


@dataclasses.dataclass(frozen=True)
class Headers:
    abi: str  # the kernel release, e.g. 6.1.0-56-amd64
    source: Path  # linux-headers-<X>-common: what /lib/modules/<abi>/source points at
    output: Path  # linux-headers-<abi>: what /lib/modules/<abi>/build points at
    packages: dict[str, str]  # package -> version: part of every build key
    # Where the trees' Debian paths begin: / for this machine's own headers, a cache dir
    # for unpacked ones (tests/realparts/newer_kernel.py); a node gets them at root-relative paths.
    root: Path = Path("/")


def installed_version(pkg: str) -> str | None:
    cp = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", pkg], capture_output=True, text=True)
    m = re.fullmatch(r"install ok installed (\S+)", cp.stdout.strip())
    return m.group(1) if m else None


def kernel_headers(log=default_log) -> Headers:
    """This machine's Debian headers for the qemu tier's ABI, installed if missing."""
    try:
        abi = vm_provision.pick_abi(vm_provision._Apt(log), log)
    except vm_provision.ProvisionError as e:
        raise ProvisionError(str(e)) from e
    if installed_version(f"linux-headers-{abi}") is None:
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", f"linux-headers-{abi}"], log=log)
    output = Path(f"/usr/src/linux-headers-{abi}")
    # Debian's arch Makefile is one line: "include /usr/src/linux-headers-<X>-common/Makefile"
    m = re.search(r"^include\s+(\S+)/Makefile\s*$", (output / "Makefile").read_text(), re.M)
    if not m or not Path(m.group(1), "include/linux/kernel.h").exists():
        raise ProvisionError(f"{output}/Makefile does not name a -common source dir")
    source = Path(m.group(1))
    packages = {p: installed_version(p) for p in (f"linux-headers-{abi}", source.name)}  # dir = package
    return Headers(abi=abi, source=source, output=output, packages=packages)


def make_args(source: Path, output: Path, jobs: int) -> list[str]:
    return [f"SYSSRC={source}", f"SYSOUT={output}", f"-j{jobs}", "modules"]


# One object of each module but nvidia-peermem: the objects whose kbuild records the
# tests compare (GNUmakefile.log-kbuild logs these and nvidia-peermem's).
COMPARED_OBJECTS = ["nvidia/nv.o", "nvidia-uvm/uvm.o", "nvidia-modeset/nvidia-modeset-linux.o",
                    "nvidia-drm/nvidia-drm-drv.o"]
# The object of NVIDIA's 535.261.03 open tree that calls pci_resize_resource with three
# arguments (kernel-open/nvidia/nv-pci.c:223), which Debian's 6.1.0-56 headers refuse.
OPEN_535_FAILING_OBJECT = "nvidia/nv-pci.o"
# NVIDIA's Makefile plus one goal: its kbuild command for single objects (see the file).
OBJECTS_MAKEFILE = Path(__file__).with_name("objects.mk")


def objects_args(source: Path, output: Path, jobs: int, objects: list[str]) -> list[str]:
    """make arguments of a build of only ``objects`` (paths relative to the tree)."""
    return ["-f", str(OBJECTS_MAKEFILE), f"SYSSRC={source}", f"SYSOUT={output}", f"-j{jobs}",
            "ndi-objects", f"NDI_OBJECTS={' '.join(objects)}"]


def direct_build(kernel_tree_copy: Path, args: list[str]) -> Path:
    """make -C <tree> ARGS (``make_args``, ``objects_args``), in place.

    Logs to <tree>/ndi-build.log; raises BuildError (with the log's tail) on failure."""
    tree = Path(kernel_tree_copy)
    log = tree / BUILD_LOG
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run(["make", "-C", str(tree), *args],
                            stdout=f, stderr=subprocess.STDOUT).returncode
        f.write(f"\n# rc={rc} in {time.monotonic() - t0:.1f} s\n")
    if rc < 0:  # make was killed (the run was stopped): no result, so nothing is cached
        raise RuntimeError(f"make was killed by signal {-rc} in {tree}")
    if rc != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(True)[-40:])
        raise BuildError(f"NVIDIA's make failed (rc={rc}) in {tree}:\n{tail}", log)
    return tree


def prune_build(tree: Path) -> None:
    """Drop sources and objects; keep what tests read (modules, .cmd files, conftest/, log)."""
    for dirpath, _dirnames, filenames in os.walk(tree, topdown=False):
        d = Path(dirpath)
        in_conftest = "conftest" in d.relative_to(tree).parts
        for name in filenames:
            keep = (in_conftest or name.endswith(".ko") or name in (BUILD_LOG, STATUS)
                    or (name.startswith(".") and name.endswith(".cmd"))
                    or name in ("Module.symvers", "modules.order"))
            if not keep:
                (d / name).unlink()
        if d != tree and not any(d.iterdir()):
            d.rmdir()


def compiler_id() -> str:
    return subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout.split("\n")[0]


def cached_build(tree: Path, headers: Headers, jobs: int = 0, *, source: Path | None = None,
                 output: Path | None = None, allow_failure: bool = False, log=default_log) -> Path:
    """A direct build of a copy of tree, cached: the result dir (see prune_build).

    source/output default to the headers' split dirs. A failed build is cached too
    (its log and conftest/); it raises BuildError unless allow_failure. jobs=0:
    every CPU; jobs is not in the key (it does not change the output)."""
    source = source or headers.source
    output = output or headers.output
    k = cache.key("direct", cache.content_hash(tree, ("debian",)), headers.packages,
                  make_args(source, output, 0), compiler_id())
    return _cached(tree, k, lambda j: make_args(source, output, j), jobs, allow_failure,
                   f"{tree.name} with SYSSRC={source} SYSOUT={output} (about 2 minutes)", log)


def cached_objects(tree: Path, headers: Headers, objects: list[str], jobs: int = 0, *,
                   allow_failure: bool = False, log=default_log) -> Path:
    """Only ``objects`` of tree (and the conftest they need), built by kbuild as NVIDIA's
    Makefile calls it (objects.mk), against the headers' split dirs; cached like
    ``cached_build`` (the result holds each object's .cmd, conftest/ and the log, no .ko)."""
    source, output = headers.source, headers.output
    k = cache.key("direct-objects", cache.content_hash(tree, ("debian",)), headers.packages,
                  make_args(source, output, 0), objects, cache.file_hash(OBJECTS_MAKEFILE),
                  compiler_id())  # objects.mk's content, not its path: the same in every clone
    return _cached(tree, k, lambda j: objects_args(source, output, j, objects), jobs,
                   allow_failure, f"{' '.join(objects)} of {tree.name}", log)


def _cached(tree: Path, k: str, args, jobs: int, allow_failure: bool, what: str, log) -> Path:
    """The cached result of make ``args(jobs)`` in a copy of tree (see ``cached_build``)."""
    jobs = jobs or os.cpu_count() or 1

    def produce(work: Path) -> None:
        copy = work / "tree"
        shutil.copytree(tree, copy, symlinks=True, ignore=shutil.ignore_patterns("debian"))
        t0 = time.monotonic()
        log(f"building {what} (-j{jobs})")
        try:
            direct_build(copy, args(jobs))
            rc = 0
        except BuildError:
            rc = 1
        log(f"make {'succeeded' if rc == 0 else 'failed'} after {time.monotonic() - t0:.0f} s")
        prune_build(copy)
        (copy / STATUS).write_text(f"{rc}\n")
        for p in copy.iterdir():
            p.rename(work / p.name)
        copy.rmdir()

    result = cache.cached_dir("builds", k, produce)
    if not allow_failure and (result / STATUS).read_text().strip() != "0":
        tail = "".join((result / BUILD_LOG).read_text(errors="replace").splitlines(True)[-40:])
        raise BuildError(f"NVIDIA's make failed (cached result {result}):\n{tail}", result / BUILD_LOG)
    return result


# ------------------------------------------------------------- flag compare

# kbuild's cc-option probes for Debian's 6.1 kernel, each compiling /dev/null: a build
# without a real /dev/null (or /proc) loses some of them silently.
PROBED_FLAGS = ["-fcf-protection=none", "-mindirect-branch=thunk-extern",
                "-mfunction-return=thunk-extern", "-mharden-sls=all",
                "-ftrivial-auto-var-init=zero", "-mrecord-mcount"]
_CMD_LINE = re.compile(r"^(?:saved)?cmd_(\S+)\s*:=\s*(.*)$", re.M)


def recorded_command(build_dir: Path, obj: str) -> tuple[str, str]:
    """(target, command) kbuild recorded for obj (relative to build_dir, e.g. nvidia/nv.o)."""
    cmd_file = Path(build_dir) / Path(obj).parent / f".{Path(obj).name}.cmd"
    m = _CMD_LINE.search(cmd_file.read_text())
    if not m:
        raise ValueError(f"{cmd_file} has no cmd_ line")
    return m.group(1), m.group(2)


def cmd_flags(build_dir: Path, obj: str, dirs: dict[str, str] | None = None) -> list[str]:
    """The compiler flags kbuild recorded for obj in build_dir (see ``flags_of``)."""
    return flags_of(*recorded_command(build_dir, obj), obj, dirs)


def logged_commands(log_text: str) -> dict[str, tuple[str, str]]:
    """obj -> (target, command) from the ``kbuild: cmd_<target> := ...`` lines the tier's
    GNUmakefile (GNUmakefile.log-kbuild) prints into make's output, kernel-build.log, or
    the stand-in into nvidia-installer.log (the build tree is gone after an install)."""
    found = {}
    for m in re.finditer(r"^\s*kbuild: (?:saved)?cmd_(\S+)\s*:=\s*(.*)$", log_text, re.M):
        target = m.group(1)
        obj = "/".join(target.split("/")[-2:])
        found[obj] = (target, m.group(2))
    return found


def flags_of(target: str, command: str, obj: str, dirs: dict[str, str] | None = None) -> list[str]:
    """The compiler flags of a kbuild command, comparable across build dirs.

    Dropped: what follows the compile (objtool), the compiler itself, -c, the
    dependency file (-Wp,-MMD,<dep>), -o <output> and the input source. The dir
    the build ran in (taken from the recorded target, so a build moved into a
    cache still compares) becomes "<build>"; each key of ``dirs`` (e.g. the kernel
    headers' source and output dirs) becomes its value."""
    if not target.endswith("/" + obj):
        raise ValueError(f"{obj}: kbuild recorded {target}")
    build = target[: -len(obj) - 1]
    # kbuild writes the command for make: '$$' stands for '$' and '\#' for '#'
    words = shlex.split(command.replace("$$", "$").replace("\\#", "#"))
    if ";" in words:  # the compile, not what follows it (objtool, checksums)
        words = words[: words.index(";")]
    source = Path(obj).with_suffix("").name
    flags: list[str] = []
    skip = False
    for i, w in enumerate(words[1:], 1):
        if skip:
            skip = False
        elif w == "-o":
            skip = True
        elif w == "-c" or w.startswith(("-Wp,-MMD,", "-Wp,-MD,")):
            pass
        elif i == len(words) - 1 and Path(w).stem == source and not w.startswith("-"):
            pass  # the input file
        else:
            w = w.replace(build, "<build>")
            for path, token in sorted((dirs or {}).items(), key=lambda kv: -len(kv[0])):
                w = w.replace(path, token)
            flags.append(w)
    return flags
