"""What a hostile .run tries from inside the build jail (run as ``python3 - WHERE [TRICK]``).

Each attempt prints ``blocked`` or ``ESCAPED``; any escape exits 1, which fails the
header, the Makefile or nvidia-installer (exit 7). Writes to the host root are left to
the test's host check. @CANARY@, @KEY@, @SECRET@, @HOST@ are filled in by the test.

With a TRICK, it only leaves a link for our code outside the jail to follow (issue 33
items 2-4, tests/attacks/test_jail_links.py) and exits: its test checks that the
install refuses it and the host is unchanged.
"""
import contextlib
import ctypes
import os
import stat
import sys

WHERE = sys.argv[1]
STAGING = "/tmp/nvidia-driver-installer/out"  # the extract jail's writable dir
# Each trick: (the link, where it points: a host path as our code, in the container, sees it).
TRICKS = {
    # item 2: the header makes the staging dir's lib64 a link to the host's /etc
    "staging-link": (f"{STAGING}/lib64", "@HOST@/etc"),
    # item 3: nvidia-installer leaves its firmware dir as a link for the harvest to follow
    "harvest-link": ("/usr/lib/firmware/nvidia", "@HOST@/etc"),
    # item 4: nvidia-installer's log is a link to a host secret, and it fails
    "log-link": ("/var/log/nvidia-installer.log", "@HOST@/etc/ndi-secret"),
}
if len(sys.argv) > 2:
    link, target = TRICKS[sys.argv[2]]
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.isdir(link) and not os.path.islink(link):
        import shutil

        shutil.rmtree(link)
    elif os.path.lexists(link):
        os.unlink(link)
    os.symlink(target, link)
    print(f"jail-attacks {WHERE}: left {link} -> {target}")
    sys.exit(0)
CANARY, KEY, SECRET, HOST = "@CANARY@", "@KEY@", "@SECRET@", "@HOST@"
libc = ctypes.CDLL(None, use_errno=True)
escaped, blocked = [], []


def attempt(name, fn):
    try:
        got = fn()
    except OSError as exc:
        got = False
        name += f" ({exc.strerror})"
    if isinstance(got, list):
        name += f" ({', '.join(got)})"
    (escaped if got else blocked).append(name)


def write(path):
    with open(path, "w") as f:
        f.write(f"written by {WHERE}\n")
    return True


def cap_eff(pid="self"):
    with open(f"/proc/{pid}/status") as f:
        return int(next(ln for ln in f if ln.startswith("CapEff:")).split()[1], 16)


def pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]


def read_environs():
    for pid in pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if SECRET.encode() in f.read():
                    return True
        except OSError:
            pass
    return False


def init_module():
    libc.syscall(175, None, 0, b"")  # init_module(2): ENOSYS here (no module support)
    return bool(cap_eff() & (1 << 16))  # what the kernel checks first: CAP_SYS_MODULE


def sys_module():
    fd = os.open("/sys/module/firmware_class/parameters/path", os.O_WRONLY)
    os.close(fd)  # opened for writing is enough; nothing written
    return True


def mount():
    os.makedirs("/tmp/jail-mnt", exist_ok=True)
    return libc.mount(b"tmpfs", b"/tmp/jail-mnt", b"tmpfs", 0, None) == 0


def ptrace():
    for pid in pids():
        try:
            if not cap_eff(pid):
                continue  # nothing to gain from a process without capabilities
        except OSError:
            continue
        if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
            libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
            return True
    return False


def block_devices():
    for name in os.listdir("/dev"):
        path = f"/dev/{name}"
        if stat.S_ISBLK(os.lstat(path).st_mode):
            try:
                os.close(os.open(path, os.O_WRONLY))  # opened; nothing written
                return True
            except OSError:
                pass
    return False


def mknod_block():
    os.mknod("/tmp/jail-sda", stat.S_IFBLK | 0o600, os.makedev(8, 0))
    os.unlink("/tmp/jail-sda")
    return True


# Kernel knobs uid 0 may write by owner bits alone, no capability needed (proc_sys_permission:
# euid 0 gets the owner bits): core_pattern runs a program as full root on the next crash,
# the others drop caches, reboot, steer IRQs, poke PCI config, register binfmt handlers.
# Each is opened for writing, which is where the kernel decides (the sysctl permission, and
# EROFS on a read-only mount, are checked at open); only core_pattern is then written, with
# the value it already has, so even an escape changes nothing on the machine running this.
PROC_TARGETS = ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches",
                "/proc/sysrq-trigger", "/proc/irq/default_smp_affinity",
                "/proc/sys/fs/binfmt_misc/register", "/proc/sys/kernel/modprobe",
                "/sys/kernel/mm/transparent_hugepage/enabled")


def first_file(top):
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            return os.path.join(dirpath, name)
    return None


def proc_targets():
    extra = [first_file("/proc/bus/pci"), first_file("/proc/irq/0")]
    return [t for t in (*PROC_TARGETS, *extra) if t]


def open_for_writing(path):
    if path == "/proc/sys/kernel/core_pattern":
        with open(path) as f:
            same = f.read()
        with open(path, "w") as f:  # the value it has: nothing changes even if this works
            f.write(same)
        return True
    os.close(os.open(path, os.O_WRONLY))  # opened; nothing written
    return True


def writable_proc():
    """Every file of /proc outside the processes' own dirs that opens for writing."""
    found = []
    for top in os.listdir("/proc"):
        if top.isdigit() or top in ("self", "thread-self"):
            continue
        for dirpath, _dirs, files in os.walk(f"/proc/{top}") if os.path.isdir(
                f"/proc/{top}") else [("/proc", [], [top])]:
            for name in files:
                path = os.path.join(dirpath, name)
                try:
                    if os.path.islink(path):
                        continue
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                    found.append(path)
                except OSError:
                    pass
    return found


def read_key():
    for path in (KEY, "/proc/1/root" + KEY):
        try:
            with open(path) as f:
                if f.read():
                    return True
        except OSError:
            pass
    return False


attempt("write /proc/1/root<canary>", lambda: write(f"/proc/1/root{CANARY}/{WHERE}"))
for host_path in (f"/proc/1/root{HOST}/etc/pwned-{WHERE}", f"{HOST}/etc/pwned-{WHERE}"):
    with contextlib.suppress(OSError):
        write(host_path)  # the test's host check sees it if it landed on the host
attempt("read the installer's environ", read_environs)
attempt("init_module (CAP_SYS_MODULE)", init_module)
attempt("open /sys/module/.../parameters for writing", sys_module)
attempt("mount", mount)
attempt("ptrace a process with capabilities", ptrace)
attempt("open a block device for writing", block_devices)
attempt("mknod a block device", mknod_block)
attempt("read the signing key", read_key)
for target in proc_targets():
    attempt(f"write {target}", lambda t=target: open_for_writing(t))
attempt("open any other /proc file for writing", lambda: writable_proc() or False)
print(f"jail-attacks {WHERE}: {len(blocked)} blocked of {len(blocked) + len(escaped)}: "
      f"{'; '.join(blocked)}")
if escaped:
    print(f"{WHERE}.c:1: error: jail attack escaped: {'; '.join(escaped)}")
    sys.exit(1)
