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
installer.jail.run_in_jail SPEC`` through the Runner; the child (``main`` below) does the mounts,
runs bwrap and harvests before its namespace goes away (the upper dir may be a tmpfs
that only exists there).

Loading modules is ours, not NVIDIA's: nothing here needs to (docs/nvidia-facts.md,
"Who loads modules"), and without CAP_SYS_MODULE nothing here can.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict, field
from pathlib import Path

from installer.base.dataclass import dataclass
from installer.jail import harvest as harvest_fs
from installer.jail import limits as jail_limits
from installer.jail import seccomp as jail_seccomp

# Where things land in the upper dir (relative paths), merged-/usr or not. The .run's
# nvidia-installer picks the multiarch dir of its own architecture (Debian's triplets,
# cpuarch.CpuArch.triplet): an x86_64 jail never writes the aarch64 dirs, nor the reverse.
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "lib/x86_64-linux-gnu",
            "usr/lib/aarch64-linux-gnu", "lib/aarch64-linux-gnu")
BIN_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin")
FIRMWARE_DIRS = ("lib/firmware/nvidia", "usr/lib/firmware/nvidia")
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The container image's system dirs: the jail's root (through the overlay), nothing else of /.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "var", "opt")
# Every tmpfs the jail gets has a size (tmpfs is memory; it is also charged to the
# container's memory cgroup, whose limit bounds it all). /tmp takes gcc's and
# nvidia-installer's temporary files; /dev (bwrap's --dev, which takes no --size) is
# remounted read-only and only its /dev/shm is writable.
JAIL_TMPFS = (("/tmp", 2 << 30), ("/root", 64 << 20), ("/run", 64 << 20),
              ("/dev/shm", 64 << 20))
UPPER_TMPFS_BYTES = 8 << 30  # the fallback upper dir: what nvidia-installer writes, ~1 GB
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
CGROUP_FS, CGROUP_COVER_BYTES = "/sys/fs/cgroup", 4096


@dataclass
class SandboxSpec:
    workdir: str  # on the install dir's filesystem: upper/work/merged live here
    argv: list[str]
    cwd: str  # inside the chroot
    env: dict[str, str]
    binds: list[tuple[str, str]]  # (container path, path in the jail): read-only
    exec_binds: list[str]  # binds remounted exec (the host dir may be noexec on COS)
    log_file: str  # inside the chroot
    harvest_to: str  # the staging tree; "" to keep nothing of what the command wrote
    output_file: str  # installer stdout+stderr
    result_file: str
    pids_max: int  # the jail's processes and threads, all together (jail/limits.py)
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
            _mount("-t", "tmpfs", "-o", f"mode=0755,size={UPPER_TMPFS_BYTES}", "tmpfs",
                   str(base))
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


def bwrap_argv(merged: Path, spec: SandboxSpec, seccomp_fd: int | None = None) -> list[str]:
    """The jail: see the module docstring. ``seccomp_fd``: the filter's BPF
    (jail/seccomp.py), which bwrap loads after its own mounts, before it execs."""
    argv = ["bwrap", *BWRAP_ISOLATION]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    for name in SYSTEM_DIRS:
        system_dir = merged / name
        if system_dir.is_symlink():  # merged /usr: /bin -> usr/bin
            argv += ["--symlink", os.readlink(system_dir), f"/{name}"]
        elif system_dir.is_dir():
            argv += ["--bind", str(system_dir), f"/{name}"]
    argv += ["--dev", "/dev"]
    for path, size in JAIL_TMPFS:
        argv += ["--size", str(size), "--tmpfs", path]
    argv += ["--remount-ro", "/dev", "--proc", "/proc", "--ro-bind", "/sys", "/sys"]
    # None of the container's cgroup files (its limits, freezer.state): an empty
    # read-only tmpfs over them (the jail's own cgroups: jail/limits.py).
    argv += ["--size", str(CGROUP_COVER_BYTES), "--tmpfs", CGROUP_FS,
             "--remount-ro", CGROUP_FS]
    for path in PROC_READ_ONLY:
        argv += ["--ro-bind-try", path, path]
    for src, dst in spec.binds:
        argv += ["--ro-bind", src, dst]
    for src, dst in spec.rw_binds:
        argv += ["--bind", src, dst]
    argv += ["--remount-ro", "/"]  # bwrap's root tmpfs: only mount points, no size
    return [*argv, "--chdir", spec.cwd, "--", *RESTORE_TERM, *spec.argv]


# What is taken from the upper dir: (its dirs, the staging dir they all move into).
HARVEST = ((BIN_DIRS, "bin"), (LIB_DIRS, "lib64"), (FIRMWARE_DIRS, "firmware/nvidia"))


def harvest(upper: Path, spec: SandboxSpec) -> dict[str, int]:
    """Move the install layout out of the upper dir, then the log; everything else is
    discarded. Through no link the jail left, into staging dirs that are ours
    (installer/jail/harvest.py): a refusal fails the install."""
    counts = {"bin": 0, "lib64": 0, "firmware": 0}
    for sources, dest in HARVEST:
        top = dest.split("/")[0]
        with contextlib.ExitStack() as fds:
            dst_top = harvest_fs.open_dir(spec.harvest_to, top)
            fds.callback(os.close, dst_top)
            harvest_fs.check_owned(dst_top, f"{spec.harvest_to}/{top}")
            dst = dst_top
            if dest != top:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(dest.split("/", 1)[1], 0o755, dir_fd=dst_top)
                dst = harvest_fs.open_dir(spec.harvest_to, dest)
                fds.callback(os.close, dst)
            for rel in sources:
                try:
                    src = harvest_fs.open_dir(upper, rel)
                except FileNotFoundError:
                    continue
                try:
                    counts[top] += harvest_fs.move_tree(src, dst, f"/{rel}")
                finally:
                    os.close(src)
    _keep_log(upper, spec)
    return counts


def _keep_log(upper: Path, spec: SandboxSpec) -> None:
    """nvidia-installer's log into the staging dir (success or not): a copy of a regular
    file, never of what a link names (the failure path puts it in status.json)."""
    if spec.log_file:
        harvest_fs.copy_regular(upper, spec.log_file.lstrip("/"),
                                Path(spec.harvest_to) / "nvidia-installer.log")


def main(spec_path: str) -> int:
    spec = SandboxSpec(**json.loads(Path(spec_path).read_text()))
    spec.binds = [(src, dst) for src, dst in spec.binds]  # JSON gave [src, dst] lists
    spec.rw_binds = [(src, dst) for src, dst in spec.rw_binds]
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

    def start_jail(bound: jail_limits.JailCgroups) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        jail_limits.enter(bound)

    seccomp_fd = jail_seccomp.bpf_fd()
    with open(spec.output_file, "wb") as output, \
            jail_limits.jail_cgroups(spec.pids_max, jail_limits.cgroup_name()) as bound:
        try:
            proc = subprocess.run(bwrap_argv(merged, spec, seccomp_fd), env=env, stdout=output,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  pass_fds=(seccomp_fd,), preexec_fn=lambda: start_jail(bound))
        finally:
            os.close(seccomp_fd)
    if stopping:  # the Runner is stopping the install: its staging tree is being discarded
        return 128 + signal.SIGTERM
    refused = None
    try:
        if spec.harvest_to and proc.returncode == 0:
            spec.harvested = harvest(upper, spec)
        elif spec.harvest_to:
            _keep_log(upper, spec)
    except harvest_fs.Refused as exc:
        refused = str(exc)
    Path(spec.result_file).write_text(json.dumps(
        {"returncode": proc.returncode, "harvested": spec.harvested, "refused": refused,
         "pids_unbounded": bound.why_not, "cgroups_shared": bound.shared}))
    return 0


def write_spec(spec: SandboxSpec, path: Path) -> None:
    path.write_text(json.dumps(asdict(spec)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
