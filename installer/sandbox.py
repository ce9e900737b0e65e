"""Run NVIDIA's code in a jail where everything it writes is captured, then harvest it.

What runs here is code from the download: the .run's makeself header (``sh X.run -x``),
NVIDIA's kernel Makefile with kbuild and the compiler (module_build.py), and
nvidia-installer ``--no-kernel-module`` (user space). It gets a jail (docs/jail.md):

- bubblewrap (``bwrap``, Debian ``bubblewrap``) as root with ``--cap-drop ALL`` and no
  user namespace: uid 0, so it writes the root-owned files of its own tree, and no
  capabilities (no init_module, mount, ptrace of privileged processes, mknod, raw I/O);
  bwrap sets no_new_privs, so no setuid file or file capability gives any back;
- its own PID, network (loopback only), IPC, UTS and cgroup namespaces, with a fresh
  procfs: none of the host's or the installer's processes, so no ``/proc/1/root`` to the
  node and no ``/proc/<pid>/environ`` of ours; its kernel knobs (``PROC_READ_ONLY``)
  read-only;
- a root made only of the container image's system dirs (``SYSTEM_DIRS``), seen through
  an overlay whose upper dir is harvested; a tmpfs ``/tmp``, ``/root`` and ``/run``; a
  minimal ``/dev`` (null, zero, full, random, urandom, tty: the real character devices
  kbuild's ``cc-option`` needs for ``-x c /dev/null``, no block devices); ``/sys``
  read-only (conftest.sh and the Makefile read it); plus the spec's binds: the extracted
  tree read-write, kernel headers and the COS toolchain read-only. The host root, the
  install dir, the signing key and the container's other files are not there.

nvidia-installer writes to fixed system paths (/usr/bin, /usr/lib/x86_64-linux-gnu,
/lib/firmware, and /etc, /usr/share, /var noise): they are the jail's system dirs, so
every write lands in the overlay's upper dir and the container's own dirs stay as
they were. Then the files that make the install layout are moved from the upper dir
into the staging tree and the rest is discarded.

bwrap 0.8.0 (Debian bookworm) has no overlay options (``--overlay-src`` came in 0.11.0),
so the overlay is mounted here, by our code, before entering bwrap, and bwrap binds its
system dirs. The parent runs ``unshare --mount --propagation private -- python -m
installer.sandbox SPEC`` through the Runner; the child (``main`` below) does the mounts,
runs bwrap and harvests before its namespace goes away (the upper dir may be a tmpfs
that only exists there).

Loading modules is ours, not NVIDIA's: nothing here needs to (docs/nvidia-facts.md,
"Who loads modules"), and without CAP_SYS_MODULE nothing here can.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
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
# The container image's system dirs: the jail's root (through the overlay), nothing else of /.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "var", "opt")
JAIL_TMPFS = ("/tmp", "/root", "/run")
# The parts of the jail's fresh procfs its uid 0 could write by owner bits alone, with no
# capability (proc_sys_permission gives euid 0 the owner bits): kernel/core_pattern runs a
# program of its choosing as full root at the next crash. bwrap 0.8 covers these only when
# access(W_OK) says it may write them, and on /proc/sys (a 0555 dir) it says no, so bwrap
# leaves it writable. Bound read-only here, after --proc, from the container's procfs: the
# same files (sysctl lookups follow the caller's namespaces, so /proc/sys/net is the jail's
# own) and recursive, so binfmt_misc below /proc/sys is covered too. /proc/pressure: PSI
# triggers, which only cost the kernel work. --ro-bind-try: a kernel may lack one of them.
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus",
                  "/proc/pressure")
# No CAP_* at all; unshare everything but the user namespace (as root without one, bwrap
# drops the capabilities itself and the jail's uid 0 owns the files it writes).
BWRAP_ISOLATION = ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                   "--unshare-cgroup-try", "--die-with-parent", "--cap-drop", "ALL")
# Not --new-session: the Runner already starts each command in a session of its own with
# no controlling terminal (no TIOCSTI), and its SIGTERM to that process group must reach
# the jail's processes (bwrap forwards no signal). bwrap would die of that TERM and
# --die-with-parent would SIGKILL the jail at once, so bwrap and this process ignore it
# and the jailed command gets it with its default action back (coreutils ``env
# --default-signal``): NVIDIA's code is asked first, and the Runner's SIGKILL after its
# grace still takes bwrap and, through --die-with-parent, everything in the jail.
RESTORE_TERM = ("env", "--default-signal=TERM", "--")


@dataclass
class SandboxSpec:
    workdir: str  # on the install dir's filesystem: upper/work/merged live here
    argv: list[str]
    cwd: str  # inside the chroot
    env: dict[str, str]
    binds: list[tuple[str, str]]  # (container path, path in the jail): read-only
    exec_binds: list[str]  # binds remounted exec (the host dir may be noexec on COS)
    kernel_install_path: str  # inside the chroot; "" when nothing installs modules
    log_file: str  # inside the chroot
    harvest_to: str  # the staging tree; "" to keep nothing of what the command wrote
    output_file: str  # installer stdout+stderr
    result_file: str
    lower: str = "/"
    rw_binds: list[tuple[str, str]] = field(default_factory=list)  # the jail's own tree
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


def _exec_source(src: str) -> None:
    """Remount ``src`` exec in our private mount namespace (bwrap keeps a bind's noexec)."""
    _mount("--bind", src, src)
    _mount("-o", "remount,bind,exec", src)


def bwrap_argv(merged: Path, spec: SandboxSpec) -> list[str]:
    """The jail: see the module docstring."""
    argv = ["bwrap", *BWRAP_ISOLATION]
    for name in SYSTEM_DIRS:
        path = merged / name
        if path.is_symlink():  # merged /usr: /bin -> usr/bin
            argv += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            argv += ["--bind", str(path), f"/{name}"]
    for path in JAIL_TMPFS:
        argv += ["--tmpfs", path]
    argv += ["--dev", "/dev", "--proc", "/proc", "--ro-bind", "/sys", "/sys"]
    for path in PROC_READ_ONLY:
        argv += ["--ro-bind-try", path, path]
    for src, dst in spec.binds:
        argv += ["--ro-bind", src, dst]
    for src, dst in spec.rw_binds:
        argv += ["--bind", src, dst]
    return [*argv, "--chdir", spec.cwd, "--", *RESTORE_TERM, *spec.argv]


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
    spec.rw_binds = [tuple(b) for b in spec.rw_binds]  # type: ignore[misc]
    # Before the overlay: a bind of a dir over itself hides the mounts below it (the
    # overlay sits in the staging dir that extract binds).
    for src, dst in [*spec.binds, *spec.rw_binds]:
        if dst in spec.exec_binds:
            _exec_source(src)
    upper = _mount_overlay(spec)
    merged = Path(spec.workdir) / "merged"
    # bwrap passes its environment on: only this, nothing of ours (secrets, proxies).
    env = {"PATH": SANDBOX_PATH, "HOME": "/root", "LANG": "C", **spec.env}
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    with open(spec.output_file, "wb") as output:
        proc = subprocess.run(bwrap_argv(merged, spec), env=env, stdout=output,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
    if stopping:  # the Runner is stopping the install: its staging tree is being discarded
        return 128 + signal.SIGTERM
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
