"""The NVIDIA ``.run``: extract it and run its nvidia-installer in the sandbox.

Shared by every distro: Ubuntu and COS differ only in where the kernel source
tree and the compiler come from.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
from pathlib import Path

import structlog

from installer.errors import BuildError, DiskSpaceError, IntegrityError, UsageError
from installer.fsutil import remove_tree
from installer.installdir import Tree
from installer.nvidia_options import LOG_FILE
from installer.runner import CommandError, Runner, tail
from installer.sandbox import SandboxSpec, write_spec
from installer.settings import Settings

log = structlog.get_logger(__name__)

EXTRACT_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 3600
EXTRACT_IN_CHROOT = "/tmp/nvidia-driver-installer/extract"


_VERSION = re.compile(r"^\d{2,4}\.\d{1,4}(\.\d{1,4})?$")
_RUN_NAME = re.compile(r"NVIDIA-Linux-x86_64-(\d[\d.]*\d)(?:-[\w.]+)?\.run$")


def run_file_name(version: str) -> str:
    return f"NVIDIA-Linux-x86_64-{version}.run"


def driver_url(settings: Settings, version: str, default_base: str | None = None) -> str:
    """--driver-url as given, else <base>/<V>/NVIDIA-Linux-x86_64-<V>.run; the base is
    --driver-base-url, else the distro's ``default_base``, else NVIDIA's for the branch."""
    if settings.driver_url:
        return settings.driver_url
    from installer.gke.mirror import nvidia_base_url

    base = settings.driver_base_url or default_base or nvidia_base_url(settings.driver_branch)
    return f"{base.rstrip('/')}/{version}/{run_file_name(version)}"


def check_version(version: str) -> str:
    if not _VERSION.match(version):
        raise UsageError(
            f"not a driver version: {version!r}",
            hint="use a version such as 550.127.05 (COS also takes default, latest, R535)",
        )
    return version


def version_from_url(url: str) -> str:
    """The driver version named by a .run URL (NVIDIA-Linux-x86_64-<V>.run)."""
    match = _RUN_NAME.search(url.split("?", 1)[0])
    if not match:
        raise UsageError(
            f"cannot tell the driver version from --driver-url {url}",
            hint="also pass --driver-version (NVIDIA_DRIVER_VERSION)",
        )
    return check_version(match.group(1))


def _cgroup_dirs(cgroup_root: Path, self_cgroup: Path) -> list[Path]:
    """Dirs whose CPU quota caps this process: the mounted root of each hierarchy (the
    container's own cgroup under a cgroup namespace) and, when the host's hierarchy is
    mounted instead, our cgroup from /proc/self/cgroup and its ancestors."""
    v1_roots = [cgroup_root / "cpu", cgroup_root / "cpu,cpuacct"]
    dirs = [cgroup_root, *v1_roots]
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "":
            bases = [cgroup_root]  # v2 unified
        elif "cpu" in controllers.split(","):
            bases = v1_roots
        else:
            continue
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        for base in bases:
            dirs += [base.joinpath(*parts[:n]) for n in range(len(parts), 0, -1)]
    return list(dict.fromkeys(dirs))


def _quota_cpus(cgroup_dir: Path) -> int | None:
    """ceil(quota / period) of a v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``; None if unlimited."""
    try:
        q, p = (cgroup_dir / "cpu.max").read_text().split()[:2]
        quota, period = (None, None) if q == "max" else (int(q), int(p))
    except (OSError, ValueError):
        try:
            quota = int((cgroup_dir / "cpu.cfs_quota_us").read_text())
            period = int((cgroup_dir / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            return None
    if not quota or not period or quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def usable_cpus(cgroup_root: Path = Path("/sys/fs/cgroup"),
                self_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """CPUs this container may really use: affinity, capped by every cgroup v2/v1 CPU
    quota between its own cgroup and the root (the tightest one wins)."""
    cpus = len(os.sched_getaffinity(0))
    quotas = [q for d in _cgroup_dirs(cgroup_root, self_cgroup) if (q := _quota_cpus(d))]
    if quotas:
        cpus = min(cpus, *quotas)
    return max(1, cpus)


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


RUN_IN_CHROOT = "/tmp/nvidia-driver-installer/run"
OUT_IN_CHROOT = "/tmp/nvidia-driver-installer/out"


def _in_sandbox(runner: Runner, spec: SandboxSpec, spec_file: Path, timeout: float,
                what: str) -> int:
    """Run ``spec`` in a private mount namespace; the command's exit status."""
    write_spec(spec, spec_file)
    try:
        runner.run(
            ["unshare", "--mount", "--propagation", "private", "--",
             sys.executable, "-m", "installer.sandbox", spec_file],
            timeout=timeout,
        )
    except CommandError as exc:
        if _ENOSPC in exc.stderr:
            raise _out_of_space(spec_file.parent, exc.stderr_tail(2)) from exc
        raise BuildError(
            f"could not run {what} in a private mount namespace: {exc.stderr_tail(3)}",
            hint="the installer container must be privileged (it mounts an overlay)",
        ) from exc
    return json.loads(Path(spec.result_file).read_text())["returncode"]


def extract(runner: Runner, run_file: Path, target: Path) -> Path:
    """``sh NVIDIA-….run -x --target DIR`` in the sandbox: the .run's shell header is the
    download's own code, so whatever else it writes stays in the sandbox's overlay. The
    archive checks its own checksums first."""
    check_space(run_file, target.parent)
    workdir = target.parent / "extract-sandbox"
    remove_tree(workdir)
    workdir.mkdir()
    output = workdir / "output.log"
    spec = SandboxSpec(
        workdir=str(workdir),
        argv=["sh", f"{RUN_IN_CHROOT}/{run_file.name}", "-x", "--target",
              f"{OUT_IN_CHROOT}/{target.name}"],
        cwd="/", env={},
        binds=[(str(run_file.parent), RUN_IN_CHROOT), (str(target.parent), OUT_IN_CHROOT)],
        exec_binds=[RUN_IN_CHROOT, OUT_IN_CHROOT],
        kernel_install_path="", log_file="", harvest_to="",
        output_file=str(output), result_file=str(workdir / "result.json"),
    )
    try:
        rc = _in_sandbox(runner, spec, workdir / "sandbox.json", EXTRACT_TIMEOUT_S,
                         f"{run_file.name} -x")
        text = output.read_text(errors="replace") if output.is_file() else ""
    finally:
        remove_tree(workdir)
    if rc != 0:
        detail = tail(text, 3)
        if _ENOSPC in text:
            raise _out_of_space(target.parent, detail)
        if any(s in detail for s in ("checksum", "Checksum", "archive size", "integrity", "corrupt")):
            raise IntegrityError(
                f"the driver package is corrupt: {detail}",
                hint="the download was damaged or truncated: re-run to download it again",
                path=str(run_file),
            )
        raise BuildError(f"could not extract {run_file.name}: {detail}", path=str(run_file))
    if not (target / "nvidia-installer").exists():
        raise BuildError(f"{run_file.name} holds no nvidia-installer", path=str(run_file))
    return target


def build(
    runner: Runner,
    *,
    extract_dir: Path,
    staging: Tree,
    argv: list[str],
    kernel_release: str,
    binds: list[tuple[str, str]],
    env: dict[str, str],
    kernel_module: bool,
) -> dict[str, int]:
    """Run nvidia-installer in the sandbox; the layout lands in ``staging``."""
    workdir = staging.root / "sandbox"
    workdir.mkdir(exist_ok=True)
    spec = SandboxSpec(
        workdir=str(workdir),
        argv=argv,
        cwd=EXTRACT_IN_CHROOT,
        env=env,
        binds=[*binds, (str(extract_dir), EXTRACT_IN_CHROOT)],
        exec_binds=[EXTRACT_IN_CHROOT],
        kernel_install_path=f"/lib/modules/{kernel_release}/video",
        log_file=LOG_FILE,
        harvest_to=str(staging.root),
        output_file=str(staging.root / "installer-output.log"),
        result_file=str(workdir / "result.json"),
    )
    log.info("nvidia_installer_started", argv=argv)
    rc = _in_sandbox(runner, spec, staging.root / "sandbox.json", BUILD_TIMEOUT_S,
                     "nvidia-installer")
    if rc != 0:
        if any(_ENOSPC in text for text in _installer_texts(staging)):
            raise _out_of_space(staging.root, installer_error(staging))
        raise BuildError(
            f"nvidia-installer failed (exit {rc}): {installer_error(staging)}",
            hint=f"see {staging.root.parent / 'nvidia-installer.failed.log'} for the full log",
            kernel_release=kernel_release,
        )
    counts = json.loads((workdir / "result.json").read_text())["harvested"]
    if kernel_module and not (staging.drivers / "nvidia.ko").exists():
        raise BuildError("nvidia-installer succeeded but produced no nvidia.ko",
                         kernel_release=kernel_release)
    log.info("nvidia_installer_finished", **{f"{k}_files": v for k, v in counts.items()})
    return counts


def _installer_texts(staging: Tree) -> list[str]:
    return [
        path.read_text(errors="replace")
        for path in (staging.root / "nvidia-installer.log", staging.root / "installer-output.log")
        if path.is_file()
    ]


_COMPILER_ERROR = re.compile(r"(?:^|\s)(\S+:\d+(?::\d+)?: (?:fatal )?error: .*)$")


def installer_error(staging: Tree) -> str:
    """The most telling lines of a failed install: the first compiler error (what a
    person fixes) with the step NVIDIA's installer was in, else its ERROR lines, else
    the output's tail."""
    texts = _installer_texts(staging)
    lines = [ln.strip() for t in texts for ln in t.splitlines()]
    compiler = next((m.group(1) for ln in lines if (m := _COMPILER_ERROR.search(ln))), None)
    errors = list(dict.fromkeys(ln for ln in lines if ln.startswith("ERROR") or "error:" in ln))
    if compiler:
        path, _, rest = compiler.partition(":")
        short = "/".join(path.split("/")[-3:])  # kernel-open/nvidia/nv-pci.c, not the sandbox path
        step = next((ln for ln in errors if ln.startswith("ERROR")), None)
        return " | ".join(x for x in (f"{short}:{rest}", step) if x)
    if errors:
        return " | ".join(errors[-4:])
    return tail(texts[-1], 3) if texts else "(no output)"


def keep_failure_log(staging: Tree, install_log: Path) -> None:
    """Keep nvidia-installer.log of a failed build next to (not inside) the install."""
    src = staging.root / "nvidia-installer.log"
    if src.is_file():
        os.replace(src, install_log.with_name("nvidia-installer.failed.log"))
