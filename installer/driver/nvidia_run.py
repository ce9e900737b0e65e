"""The NVIDIA ``.run``: extract it, build its kernel modules with NVIDIA's Makefile,
then run its nvidia-installer for user space only, each in the sandbox.

Shared by every distro: Ubuntu and COS differ only in where the kernel source
tree and the compiler come from. Nothing here loads or unloads a module
(module_build.py says why); modules.py does, after the checks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import field
from pathlib import Path
from typing import Any

import structlog

from installer.base import cpuarch
from installer.base.cpuarch import CpuArch
from installer.base.dataclass import dataclass
from installer.base.errors import BuildError, DiskSpaceError, IntegrityError
from installer.base.fsutil import remove_tree
from installer.driver import module_build
from installer.driver.nvidia_options import LOG_FILE, check_loads_nothing
from installer.driver.nvidia_urls import run_file_name
from installer.host.installdir import BUILD_LOG, Tree
from installer.host.runner import CommandError, Runner, tail
from installer.jail import harvest
from installer.jail.run_in_jail import SandboxSpec, write_spec
from installer.jail.visible import visible
from installer.kmod.headers import KernelTree

log = structlog.get_logger(__name__)

EXTRACT_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 3600
# The jail's processes and threads together (installer/jail/limits.py): kbuild runs a
# handful per make job, and the jobs are at most the CPUs; a fork bomb stops here.
JAIL_PIDS_MAX = 4096
EXTRACT_IN_CHROOT = "/tmp/nvidia-driver-installer/extract"
KBUILD_LOG = BUILD_LOG  # make's output, in the staging dir, then beside the install
FAILED_LOG = "nvidia-installer.failed.log"  # the failed build's log, beside the install
# No file the jail writes may grow past this (RLIMIT_FSIZE, which its uid 0 without
# CAP_SYS_RESOURCE cannot raise): its output file included. The largest file NVIDIA's build
# writes is ~200 MB (nvidia.ko with debug info, cache.MAX_FILE_BYTES); a writer past the
# bound gets EFBIG and SIGXFSZ, and the build fails with its output's tail (docs/jail.md).
JAIL_FILE_MAX_BYTES = 1 << 30


def bounded_argv(argv: list[str]) -> list[str]:
    """``argv`` run under the jail's file-size bound (util-linux ``prlimit``: one value
    sets the soft and the hard limit)."""
    return ["prlimit", f"--fsize={JAIL_FILE_MAX_BYTES}", "--", *argv]


MANIFEST_HEAD_BYTES = 4096  # its first two lines


def check_extracted_version(extract_dir: Path, wanted: str, url: str | None) -> None:
    """Exit 6 when the extracted .run is another driver than ``wanted``: its ``.manifest``
    names it on line 2 (nvidia-installer install-from-cwd.c: description, then version).
    Checked before anything is built, loaded or unloaded: the driver on the node stays."""
    head = harvest.read_head(extract_dir, ".manifest", MANIFEST_HEAD_BYTES)  # no link: a
    if head is None:  # link would put a host file's line in the message
        return  # no manifest to tell: nvidia-installer itself refuses such a tree
    lines = head.decode(errors="replace").splitlines()[:2]
    found = visible(lines[1].strip()) if len(lines) == 2 else ""
    if found and found != wanted:
        raise IntegrityError(
            f"the .run{' at ' + url if url else ''} is driver {found}, not {wanted}",
            hint="point --driver-url (NVIDIA_DRIVER_DOWNLOAD_URL) at the "
            f"{run_file_name(wanted)} .run, or set --driver-version {found}",
            driver_version=wanted, url=url)


# Extracted payload plus what nvidia-installer writes is about this many times the .run.
SPACE_FACTOR = 3
_ENOSPC = "No space left on device"


def check_space(run_file: Path, where: Path) -> None:
    """Exit 11 before extracting when the install dir's filesystem cannot hold the build."""
    needed = run_file.stat().st_size * SPACE_FACTOR
    free = shutil.disk_usage(where).free
    if free < needed:
        raise DiskSpaceError(
            f"not enough disk space in {where}: need about {needed / 2**20:.0f} MiB to extract "
            f"and install {run_file.name}, {free / 2**20:.0f} MiB free",
            hint="free space on the host filesystem holding the install dir",
            path=str(where),
        )


def _out_of_space(where: Path, detail: str) -> DiskSpaceError:
    return DiskSpaceError(
        f"the disk filled up in {where}: {detail}",
        hint="free space on the host filesystem holding the install dir and re-run",
        path=str(where),
    )


# An NVIDIA .run is a makeself archive: a shell header, then the payload. NVIDIA's makeself
# (1.6.0-nv2, shipped inside the .run as makeself.sh) starts it with "#! /bin/sh" and the lines
# CRCsum=, MD5=, skip=, label=; stock makeself 2.x writes "#!/bin/sh", CRCsum=, label=, skip=.
# The payload starts after `skip` lines (`tail -n +$skip` / `head -n $skip`).
_SHEBANG = re.compile(rb"#! ?/bin/(?:ba)?sh\s")
_HEADER_VARS = (re.compile(rb"^CRCsum=", re.M), re.compile(rb"^label=", re.M))
_SKIP = re.compile(rb'^skip="?(\d+)', re.M)
# What each makeself prints when the archive fails its own check: NVIDIA's "Error in check
# sums" / "Error in md5 sums"; 2.x's "Error in checksums", "Error in MD5|SHA256 checksums",
# "Unexpected archive size". Not "integrity": both print "Verifying archive integrity..."
# before every extraction.
_CORRUPT = re.compile(r"error in (?:check ?sums|md5 (?:check)?sums|sha256 checksums)"
                      r"|unexpected archive size|corrupt", re.I)
HEAD_BYTES = 64 * 1024  # the variables sit in the first few hundred bytes
PREVIEW_CHARS = 40


def preview(data: bytes, limit: int = PREVIEW_CHARS) -> str:
    """``data`` as text safe to print: non-printable bytes become '.', cut with an ellipsis."""
    text = "".join(c if c.isprintable() and c.isascii() else "." if c not in "\n\r\t" else " "
                   for c in data[:limit].decode("latin-1"))
    return text + ("…" if len(data) > limit else "")


def check_run_file(run_file: Path, *, from_network: bool = False) -> None:
    """Exit 6 before running anything of ``run_file`` when it is not a whole makeself archive:
    an HTML page from a proxy, random bytes or a header cut off would otherwise be run by sh
    and fail as shell syntax errors (a "build failure"). Its first bytes are shown only
    when a server sent them (a proxy's page): a local file (``file:///etc/shadow``) is
    never shown, in the message, the log or status.json."""
    with run_file.open("rb") as f:
        head = f.read(HEAD_BYTES)
        skip = _SKIP.search(head)
        if _SHEBANG.match(head) and skip and all(v.search(head) for v in _HEADER_VARS):
            lines, want = head.count(b"\n"), int(skip.group(1)) - 1
            while lines < want and (chunk := f.read(HEAD_BYTES)):
                lines += chunk.count(b"\n")
            if lines >= want:
                return
            why = f"its makeself header is cut off after {lines} of {want} lines"
        else:
            why = (f"starts with: '{preview(head)}'" if from_network
                   else "a local file without a makeself header; its content is not shown"
                   ) if head else "the file is empty"
    raise IntegrityError(
        f"{run_file.name} is not an NVIDIA installer ({why})",
        hint="the server sent something else (a proxy's HTML page, an error, a cut-off "
        "download): check --driver-url and the proxy, then re-run",
        path=str(run_file),
    )


RUN_IN_CHROOT = "/tmp/nvidia-driver-installer/run"
OUT_IN_CHROOT = "/tmp/nvidia-driver-installer/out"


def _in_sandbox(runner: Runner, spec: SandboxSpec, spec_file: Path, timeout: float,
                what: str) -> dict[str, Any]:
    """Run ``spec`` in the jail (jail/run_in_jail.py); its result record (``returncode``,
    ``harvested``). It runs for minutes: a heartbeat shows the last line of its output
    (a file of ours: nothing the jail wrote is read while it runs, docs/jail.md)."""
    write_spec(spec, spec_file)
    watch = [Path(spec.output_file)]
    try:
        runner.run(
            ["unshare", "--mount", "--propagation", "private", "--",
             sys.executable, "-m", "installer.jail.run_in_jail", spec_file],
            timeout=timeout, long_running=what, watch=watch,
        )
    except CommandError as exc:
        if _ENOSPC in exc.stderr:
            raise _out_of_space(spec_file.parent, exc.stderr_tail(2)) from exc
        raise BuildError(
            f"could not run {what} in the build jail: {visible(exc.stderr_tail(3))}",
            hint="the installer container must be privileged (it mounts an overlay and "
            "runs bwrap, Debian's bubblewrap)",
        ) from exc
    result: dict[str, Any] = json.loads(Path(spec.result_file).read_text())
    if result.get("pids_unbounded"):
        log.warning("jail_pids_unbounded", command=what, reason=result["pids_unbounded"])
    if result.get("refused"):
        raise _refusal(what, result["refused"])
    return result


def _refusal(what: str, why: str) -> BuildError:
    return BuildError(
        f"{what} left something the install will not take: {visible(why)} "
        "(installer/jail/harvest.py); "
        "nothing was installed",
        hint="NVIDIA's .run makes only files, dirs and links inside its own tree: this one "
        "is not as published; check --driver-url and pin --driver-sha256")


def kernel_tree_binds(tree: KernelTree) -> list[tuple[str, str]]:
    """The kernel headers' source and output dirs at their own paths, plus the dirs their
    top-level symlinks lead to (Debian's output dir links ``scripts`` and ``tools`` into
    ``/usr/lib/linux-kbuild-<v>``): what kbuild reads, and nothing else of the host root."""
    dirs: list[Path] = []
    for top in dict.fromkeys((tree.source, tree.output)):
        dirs.append(top)
        for entry in sorted(top.iterdir()) if top.is_dir() else ():
            target = entry.resolve() if entry.is_symlink() else None
            # A link that leads to / or to an ancestor of the tree would show it all.
            if target is not None and target.is_dir() and target.parent != target \
                    and not top.is_relative_to(target):
                dirs.append(target)
    kept = [d for d in dict.fromkeys(dirs)
            if not any(d != o and d.is_relative_to(o) for o in dirs)]
    return [(str(d), str(d)) for d in kept]


def extract_argv(run_name: str, target_name: str) -> list[str]:
    """The .run's own self-extraction, run in the sandbox (paths as the sandbox sees them)."""
    return ["sh", f"{RUN_IN_CHROOT}/{run_name}", "-x", "--target", f"{OUT_IN_CHROOT}/{target_name}"]


def extract(runner: Runner, run_file: Path, target: Path,
            rw_binds: list[tuple[str, str]] | None = None, *, from_network: bool = False,
            ) -> Path:
    """``sh NVIDIA-….run -x --target DIR`` in the jail: the .run's shell header is the
    download's own code, so it sees the .run (read-only) and the dir it extracts into,
    and whatever else it writes stays in the jail's overlay. The archive checks its own
    checksums first. ``from_network``: the .run came from a server (check_run_file)."""
    check_run_file(run_file, from_network=from_network)
    check_space(run_file, target.parent)
    workdir = target.parent / "extract-sandbox"
    remove_tree(workdir)
    workdir.mkdir()
    # The header writes only here: a fresh, empty dir of its own, never the staging dir
    # (a link it made there would route our later moves to the host).
    out = workdir / "out"
    out.mkdir()
    output = workdir / "output.log"
    spec = SandboxSpec(
        workdir=str(workdir),
        argv=bounded_argv(extract_argv(run_file.name, target.name)),
        cwd="/", env={},
        binds=[(str(run_file.parent), RUN_IN_CHROOT)],
        rw_binds=[*(rw_binds or []), (str(out), OUT_IN_CHROOT)],
        exec_binds=[RUN_IN_CHROOT, OUT_IN_CHROOT],
        log_file="", harvest_to="", pids_max=JAIL_PIDS_MAX,
        output_file=str(output), result_file=str(workdir / "result.json"),
    )
    what = f"{run_file.name} -x"
    try:
        rc = _in_sandbox(runner, spec, workdir / "sandbox.json", EXTRACT_TIMEOUT_S,
                         what)["returncode"]
        text = harvest.read_tail(output)
        if rc == 0:
            _take_extracted(out, target, what)
    finally:
        remove_tree(workdir)
    if rc != 0:
        lines = [preview(ln.encode(), 200) for ln in tail(text, 3).splitlines()]
        detail = " | ".join(lines)
        if _ENOSPC in text:
            raise _out_of_space(target.parent, detail)
        if corrupt := next((ln for ln in lines if _CORRUPT.search(ln)), None):
            raise IntegrityError(
                f"the driver package is corrupt: {corrupt}",
                hint="the download was damaged or truncated: re-run to download it again",
                path=str(run_file),
            )
        raise BuildError(f"could not extract {run_file.name}: {detail}", path=str(run_file))
    if not (target / "nvidia-installer").exists():
        raise BuildError(f"{run_file.name} holds no nvidia-installer", path=str(run_file))
    return target


def _take_extracted(out: Path, target: Path, what: str) -> None:
    """The extracted tree into ``target``, if it is a real directory (not a link the
    header left) and nothing else is beside it."""
    try:
        fd = harvest.open_dir(out, target.name)
        os.close(fd)
        extra = sorted(set(os.listdir(out)) - {target.name})
        if extra:
            raise harvest.Refused(f"/{extra[0]}", "beside the extracted tree")
    except FileNotFoundError:
        return  # "holds no nvidia-installer" says it
    except harvest.Refused as exc:  # named as the header saw it
        raise _refusal(what, f"{OUT_IN_CHROOT}{exc}") from None
    os.replace(out / target.name, target)


BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")


def check_runs_here(program: Path, build_arch: CpuArch, binfmt_dir: Path = BINFMT_DIR) -> None:
    """Exit 7 before a cross build when the .run's ``program`` (nvidia-installer: an
    aarch64 ELF in NVIDIA's aarch64 .run) is another machine's binary and no enabled
    binfmt_misc entry (qemu-user-static's ``qemu-aarch64``) would run it here."""
    with program.open("rb") as f:
        head = f.read(cpuarch.ELF_HEAD_BYTES)
    target = cpuarch.elf_arch(head)
    if target is None or target == build_arch:
        return  # a script, or this machine's own binary
    entries = sorted(binfmt_dir.iterdir()) if binfmt_dir.is_dir() else []
    for entry in entries:
        try:
            if entry.name not in ("register", "status") and cpuarch.binfmt_runs(
                    entry.read_text(errors="replace"), head):
                return
        except OSError:
            continue
    raise BuildError(
        f"{program.name} of the .run is an {target} binary and this {build_arch} machine "
        f"cannot run it (no binfmt_misc entry for {target})",
        hint="install qemu-user-static (it registers qemu-aarch64 with binfmt_misc), or "
        f"build on an {target} machine", path=str(program))


@dataclass(frozen=True)
class BuildJail:
    """What both build steps in the jail (build_modules, install_userspace) are given:
    the extracted .run, the staging tree they fill, the kernel release (for messages),
    the read-only binds (container path, jail path), the environment, and writable
    binds (the test seams; empty in production)."""

    extract_dir: Path
    staging: Tree
    kernel_release: str
    binds: list[tuple[str, str]]
    env: dict[str, str]
    rw_binds: list[tuple[str, str]] = field(default_factory=list)


def build_modules(runner: Runner, jail: BuildJail, *, argv: list[str], tree_dir: str) -> list[str]:
    """NVIDIA's Makefile (``argv``: module_build.make_argv) in the sandbox; the modules
    it leaves in ``<extract>/<tree_dir>`` (a bind: they outlive the sandbox) move into
    ``staging/drivers``. Nothing is loaded: make runs no kmod tool."""
    log.info("kernel_modules_build_started", argv=argv)
    staging, extract_dir, kernel_release = jail.staging, jail.extract_dir, jail.kernel_release
    rc = _on_extracted_tree(runner, argv, f"make ({tree_dir}/)", extract_dir=extract_dir,
                            staging=staging, binds=jail.binds, rw_binds=jail.rw_binds,
                            env=jail.env, output=KBUILD_LOG)["returncode"]
    _raise_for(rc, staging, "building NVIDIA's kernel modules failed (make ", kernel_release)
    staging.drivers.mkdir(parents=True, exist_ok=True)
    try:
        names = harvest.move_files(extract_dir, tree_dir, module_build.MODULE_FILES,
                                   staging.drivers)
    except harvest.Refused as exc:
        raise _refusal(f"make ({tree_dir}/)", str(exc)) from None
    if module_build.REQUIRED not in names:
        raise BuildError(f"make succeeded but produced no {module_build.REQUIRED} in {tree_dir}/",
                         kernel_release=kernel_release)
    log.info("kernel_modules_built", modules=names)
    return names


def install_userspace(runner: Runner, jail: BuildJail, *, argv: list[str]) -> dict[str, int]:
    """nvidia-installer (``argv``: nvidia_options.installer_args, which always holds
    --no-kernel-module) in the sandbox; user space, firmware and nvidia-modprobe land
    in ``staging``."""
    check_loads_nothing(argv)
    log.info("nvidia_installer_started", argv=argv)
    result = _on_extracted_tree(runner, argv, "nvidia-installer", extract_dir=jail.extract_dir,
                                staging=jail.staging, binds=jail.binds, rw_binds=jail.rw_binds,
                                env=jail.env, output="installer-output.log", log_file=LOG_FILE,
                                harvest=True)
    _raise_for(result["returncode"], jail.staging, "nvidia-installer failed (",
               jail.kernel_release)
    counts: dict[str, int] = result["harvested"]
    log.info("nvidia_installer_finished", **{f"{k}_files": v for k, v in counts.items()})
    return counts


def run_tree_tool(runner: Runner, argv: list[str], what: str, *, extract_dir: Path,
                  staging: Tree) -> None:
    """Another program of the .run's own (COS's ``mkprecompiled``) in the jail, on the
    extracted tree (``argv`` names it as the jail sees it: EXTRACT_IN_CHROOT); exit 7
    with its output's tail when it fails."""
    output = "tool-output.log"
    rc = _on_extracted_tree(runner, argv, what, extract_dir=extract_dir, staging=staging,
                            binds=[], rw_binds=None, env={}, output=output)["returncode"]
    if rc != 0:
        text = _last_lines(harvest.read_tail(staging.root / output))
        raise BuildError(f"{what} failed (exit {rc}): {text or '(no output)'}")


def _on_extracted_tree(runner: Runner, argv: list[str], what: str, *, extract_dir: Path,
                       staging: Tree, binds: list[tuple[str, str]],
                       rw_binds: list[tuple[str, str]] | None, env: dict[str, str],
                       output: str, log_file: str = "", harvest: bool = False) -> dict[str, Any]:
    """``argv`` in the jail with the extracted .run as its (writable) working dir; its
    output in ``staging/<output>``; what it wrote to system paths harvested into
    ``staging`` when ``harvest``."""
    workdir = staging.root / "sandbox"
    workdir.mkdir(exist_ok=True)
    spec = SandboxSpec(
        workdir=str(workdir), argv=bounded_argv(argv), cwd=EXTRACT_IN_CHROOT, env=env, binds=binds,
        rw_binds=[*(rw_binds or []), (str(extract_dir), EXTRACT_IN_CHROOT)],
        exec_binds=[EXTRACT_IN_CHROOT], log_file=log_file, pids_max=JAIL_PIDS_MAX,
        harvest_to=str(staging.root) if harvest else "",
        output_file=str(staging.root / output), result_file=str(workdir / "result.json"),
    )
    return _in_sandbox(runner, spec, staging.root / "sandbox.json", BUILD_TIMEOUT_S, what)


def _raise_for(rc: int, staging: Tree, what: str, kernel_release: str) -> None:
    """Exit 11 when the disk filled up, else exit 7 with the first compiler error."""
    if rc == 0:
        return
    if any(_ENOSPC in text for text in _installer_texts(staging)):
        raise _out_of_space(staging.root, installer_error(staging))
    raise BuildError(
        f"{what}exit {rc}): {installer_error(staging)}",
        kernel_release=kernel_release,
    )


def _installer_texts(staging: Tree) -> list[str]:
    """The tails of make's output, nvidia-installer's log and its output."""
    return [
        harvest.read_tail(path)
        for path in (staging.root / KBUILD_LOG, staging.root / "nvidia-installer.log",
                     staging.root / "installer-output.log")
        if path.is_file()
    ]


_COMPILER_ERROR = re.compile(r"(?:^|\s)(\S+:\d+(?::\d+)?: (?:fatal )?error: .*)$")


def installer_error(staging: Tree) -> str:
    """The most telling lines of a failed install: the first compiler error (what a
    person fixes) with the step NVIDIA's installer was in, else its ERROR lines, else
    the output's tail."""
    texts = _installer_texts(staging)
    lines = [visible(ln.strip()) for t in texts for ln in t.splitlines()]
    compiler = next((m.group(1) for ln in lines if (m := _COMPILER_ERROR.search(ln))), None)
    errors = list(dict.fromkeys(ln for ln in lines if ln.startswith("ERROR") or "error:" in ln))
    if compiler:
        path, _, rest = compiler.partition(":")
        short = "/".join(path.split("/")[-3:])  # kernel-open/nvidia/nv-pci.c, not the sandbox path
        step = next((ln for ln in errors if ln.startswith("ERROR")), None)
        return " | ".join(x for x in (f"{short}:{rest}", step) if x)
    if errors:
        return " | ".join(errors[-4:])
    return _last_lines(texts[-1]) if texts else "(no output)"


def _last_lines(text: str, count: int = 3) -> str:
    """The last ``count`` lines of ``text`` on one line, each made visible."""
    return " | ".join(visible(ln) for ln in tail(text, count).splitlines())


def keep_failure_log(staging: Tree, install_log: Path) -> Path | None:
    """Keep the log of a failed build next to (not inside) the install: nvidia-installer's,
    else make's (the build stopped before nvidia-installer ran). Returns where, if kept."""
    for src in (staging.root / "nvidia-installer.log", staging.root / KBUILD_LOG):
        if src.is_file():
            kept = install_log.with_name(FAILED_LOG)
            os.replace(src, kept)
            return kept
    return None
