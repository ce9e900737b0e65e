"""Run the NVIDIA installer where everything it writes is captured, then harvest it.

nvidia-installer writes to fixed system paths (/usr/bin, /usr/lib/x86_64-linux-gnu,
/lib/modules/<kernel>/..., /lib/firmware, and /etc, /usr/share, /var noise).
Rather than chase those paths with one overlay each, we run it chrooted into
an overlay of this container's whole root, in a private mount namespace: every
write lands in the overlay's upper dir and the container's own dirs stay as
they were. Then the files that make the install layout are moved from the
upper dir into the staging tree and the rest is discarded.

The chroot is a build environment: an overlay of ``/`` does not show
submounts, and a registry image's own ``/dev`` is empty, so without binds the
first ``> /dev/null`` creates a plain file that kbuild's ``cc-option`` then
compiles (``-x c /dev/null``) and NVIDIA's Kbuild appends to its conftest
headers: probes fail silently and flags drop. The container's ``/dev``,
``/proc`` and ``/sys`` are bound in (read the same, nothing of the container
changed).

Loading modules is ours, not NVIDIA's: what runs here is NVIDIA's Makefile
(module_build.py) and nvidia-installer with ``--no-kernel-module``, which loads,
unloads and test-loads nothing (docs/nvidia-facts.md, "Who loads modules"). No
kmod stand-ins are put on PATH: they never protected the host (nvidia-installer
test-loads through ``syscall(SYS_init_module)``, not insmod) and an inert rmmod
left test-loaded modules in the kernel; a stray kmod call now reaches the real
tools and is seen, instead of hidden.

The parent runs ``unshare --mount --propagation private -- python -m
installer.sandbox SPEC`` through the Runner; the child (``main`` below) does the
mounts, runs the installer and harvests before its namespace goes away (the
upper dir may be a tmpfs that only exists there).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Where things land in the upper dir (relative paths), merged-/usr or not.
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "lib/x86_64-linux-gnu")
BIN_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin")
FIRMWARE_DIRS = ("lib/firmware/nvidia", "usr/lib/firmware/nvidia")
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM_BINDS = ("/dev", "/proc", "/sys")  # the build environment kbuild and conftest.sh read


@dataclass
class SandboxSpec:
    workdir: str  # on the install dir's filesystem: upper/work/merged live here
    argv: list[str]
    cwd: str  # inside the chroot
    env: dict[str, str]
    binds: list[tuple[str, str]]  # (container path, path inside the chroot)
    exec_binds: list[str]  # binds remounted exec (the host dir may be noexec on COS)
    kernel_install_path: str  # inside the chroot; "" when nothing installs modules
    log_file: str  # inside the chroot
    harvest_to: str  # the staging tree; "" to keep nothing of what the command wrote
    output_file: str  # installer stdout+stderr
    result_file: str
    lower: str = "/"
    harvested: dict[str, int] = field(default_factory=dict)


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


def _mount_overlay(spec: SandboxSpec) -> Path:
    work = Path(spec.workdir)
    merged = work / "merged"
    merged.mkdir(parents=True, exist_ok=True)
    for base in (work, work / "tmpfs"):
        if base != work:
            # Upper dir beside the lower root on one filesystem is refused by
            # some kernels ("overlapping layers"): fall back to a tmpfs.
            base.mkdir(exist_ok=True)
            _mount("-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(base))
        upper, ovl_work = base / "upper", base / "work"
        upper.mkdir(exist_ok=True)
        ovl_work.mkdir(exist_ok=True)
        opts = f"lowerdir={spec.lower},upperdir={upper},workdir={ovl_work}"
        try:
            _mount("-t", "overlay", "overlay", "-o", opts, str(merged))
            return upper
        except subprocess.CalledProcessError as exc:
            err = exc.stderr
    raise RuntimeError(f"cannot mount the overlay of {spec.lower}: {err.strip()}")


def _bind(src: str, merged: Path, dst: str, make_exec: bool) -> None:
    target = merged / dst.lstrip("/")
    if Path(src).is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(exist_ok=True)
    _mount("--rbind", src, str(target))
    if make_exec:
        _mount("-o", "remount,bind,exec", str(target))


def _is_whiteout(path: Path) -> bool:
    st = path.lstat()
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _move_tree(src: Path, dst: Path) -> int:
    """Move files (and symlinks) from src into dst, keeping sub-dirs; skip whiteouts."""
    count = 0
    for dirpath, dirnames, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_dir() and not path.is_symlink():
                (dst / rel / name).mkdir(parents=True, exist_ok=True)
                continue
            if _is_whiteout(path):
                continue
            (dst / rel).mkdir(parents=True, exist_ok=True)
            shutil.move(str(path), str(dst / rel / name))
            count += 1
    return count


def harvest(upper: Path, spec: SandboxSpec) -> dict[str, int]:
    """Move the install layout out of the upper dir; everything else is discarded."""
    out = Path(spec.harvest_to)
    counts = {"bin": 0, "lib64": 0, "drivers": 0, "firmware": 0}
    kernel_dirs = [spec.kernel_install_path.lstrip("/")] if spec.kernel_install_path else []
    if kernel_dirs and kernel_dirs[0].startswith("lib/"):
        kernel_dirs.append("usr/" + kernel_dirs[0])
    for rel in kernel_dirs:
        src = upper / rel
        if src.is_dir():
            for ko in sorted(src.glob("*.ko")):
                shutil.move(str(ko), str(out / "drivers" / ko.name))
                counts["drivers"] += 1
    for rels, name in ((BIN_DIRS, "bin"), (LIB_DIRS, "lib64")):
        for rel in rels:
            if (upper / rel).is_dir():
                counts[name] += _move_tree(upper / rel, out / name)
    for rel in FIRMWARE_DIRS:
        if (upper / rel).is_dir():
            counts["firmware"] += _move_tree(upper / rel, out / "firmware" / "nvidia")
    log_src = upper / spec.log_file.lstrip("/")
    if log_src.is_file():
        shutil.move(str(log_src), str(out / "nvidia-installer.log"))
    return counts


def main(spec_path: str) -> int:
    spec = SandboxSpec(**json.loads(Path(spec_path).read_text()))
    spec.binds = [tuple(b) for b in spec.binds]  # type: ignore[misc]
    upper = _mount_overlay(spec)
    merged = Path(spec.workdir) / "merged"
    for path in SYSTEM_BINDS:
        _bind(path, merged, path, make_exec=False)
    for src, dst in spec.binds:
        _bind(src, merged, dst, dst in spec.exec_binds)

    def enter_chroot() -> None:
        os.chroot(merged)
        os.chdir(spec.cwd)

    env = {"PATH": SANDBOX_PATH, "HOME": "/root", "LANG": "C", **spec.env}
    with open(spec.output_file, "wb") as output:
        proc = subprocess.run(spec.argv, env=env, stdout=output, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, preexec_fn=enter_chroot)  # noqa: PLW1509
    if spec.harvest_to and proc.returncode == 0:
        spec.harvested = harvest(upper, spec)
    elif spec.harvest_to:
        log_src = upper / spec.log_file.lstrip("/")
        if log_src.is_file():
            shutil.copy(log_src, Path(spec.harvest_to) / "nvidia-installer.log")
    Path(spec.result_file).write_text(
        json.dumps({"returncode": proc.returncode, "harvested": spec.harvested})
    )
    return 0


def write_spec(spec: SandboxSpec, path: Path) -> None:
    path.write_text(json.dumps(asdict(spec)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
