"""The jail's seccomp filter: the syscalls NVIDIA's build never makes, refused.

Made with libseccomp (Debian ``libseccomp2``) through ``pyseccomp``, a ctypes binding
API-compatible with libseccomp's own Python bindings (those are built per interpreter,
and the Ubuntu image runs python3.11 on jammy, whose python3-seccomp is for 3.10): the
BPF is libseccomp's, exported to a file that bwrap loads (``--seccomp FD``) after its own
set-up, just before it execs the jailed command. Everything else is allowed: the jail
runs gcc, make, sh, tar, Python and nvidia-installer, and an allow-list would be a guess
at all of their syscalls.

Refused (docs/jail.md lists each with the attack test that proves it), from what
Docker's default profile refuses (moby profiles/seccomp/default.json) and NVIDIA's
build (nvidia-installer, its Makefile over kbuild, gcc, make, makeself's extraction)
never calls:

- new namespaces: ``unshare``, ``setns``, and ``clone`` with any ``CLONE_NEW*`` flag
  (arg 0 on x86_64); ``clone3`` answers ENOSYS, so glibc falls back to ``clone``, whose
  flags a filter can see (clone3's are behind a pointer). A user namespace gives uid 0
  every capability over new mounts: a cgroupfs whose limits it could lift (docs/jail.md, J1);
- the kernel keyrings, which are not namespaced: ``add_key``, ``request_key``,
  ``keyctl`` (J4: a key in root's user keyring outlives the jail and fills the node's
  root quota);
- mounts after bwrap's own: ``mount``, ``umount2``, ``pivot_root``, ``chroot`` and the
  new mount API (``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``, ``move_mount``,
  ``open_tree``, ``mount_setattr``);
- the kernel itself: ``init_module``, ``finit_module``, ``delete_module``,
  ``kexec_load``, ``kexec_file_load``, ``reboot``, ``bpf``, ``perf_event_open``,
  ``iopl``, ``ioperm``, ``swapon``, ``swapoff``, ``acct``, ``quotactl``, ``syslog``,
  ``settimeofday``, ``clock_settime``, ``clock_adjtime``, ``uselib``, ``ustat``,
  ``sysfs``, ``_sysctl``, ``lookup_dcookie``, ``userfaultfd``, ``io_uring_*``;
- other processes and handles: ``ptrace``, ``process_vm_readv``,
  ``process_vm_writev``, ``kcmp``, ``pidfd_getfd``, ``open_by_handle_at``,
  ``name_to_handle_at``;
- NUMA placement: ``mbind``, ``set_mempolicy``, ``get_mempolicy``, ``move_pages``,
  ``migrate_pages``.

Most of these already fail for lack of a capability; the filter refuses them before
the kernel looks, so a capability regained another way (a user namespace) gives none
of them back.
"""

from __future__ import annotations

import errno
import os
import tempfile
from typing import Any

# Each answered EPERM, as Docker's profile does.
REFUSED = (
    "unshare", "setns",
    "add_key", "request_key", "keyctl",
    "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "bpf", "perf_event_open", "iopl", "ioperm", "swapon", "swapoff", "acct",
    "quotactl", "syslog", "settimeofday", "clock_settime", "clock_adjtime", "uselib",
    "ustat", "sysfs", "_sysctl", "lookup_dcookie", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "open_by_handle_at", "name_to_handle_at",
    "mbind", "set_mempolicy", "get_mempolicy", "move_pages", "migrate_pages",
)
# clone(2)'s namespace flags (include/uapi/linux/sched.h): any one of them is refused.
CLONE_NEW_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080,
}


def build_filter() -> Any:  # a pyseccomp.SyscallFilter (pyseccomp ships no types)
    """The filter, as a libseccomp ``SyscallFilter``: allow, except the refused. Without
    libseccomp the jail does not run at all (SystemExit: one line on the jail's stderr,
    which the installer quotes as the build's error): never a jail without its filter."""
    # Deferred to the jail's start: loading the binding runs ``ldconfig -p`` (ctypes'
    # find_library) and dlopens libseccomp, ~20-30 ms that a run building nothing (a cache
    # hit, every boot) would pay for nothing.
    try:
        import pyseccomp as seccomp  # ctypes: loads libseccomp.so.2 (Debian libseccomp2)
    except (ImportError, RuntimeError, OSError) as exc:  # no libseccomp.so.2: no jail
        raise SystemExit(f"the build jail needs its seccomp filter: libseccomp could not be "
                         f"loaded ({exc}); install libseccomp2 (Debian/Ubuntu) in the "
                         "installer's image") from None
    flt = seccomp.SyscallFilter(seccomp.ALLOW)
    if seccomp.system_arch() == seccomp.Arch.X86_64:
        # The 32-bit and x32 entry points get the same rules (any other arch is killed:
        # libseccomp's default bad-arch action).
        flt.add_arch(seccomp.Arch.X86)
        flt.add_arch(seccomp.Arch.X32)
    refuse = seccomp.ERRNO(errno.EPERM)
    for name in REFUSED:
        flt.add_rule(refuse, name)
    for flag in CLONE_NEW_FLAGS.values():
        flt.add_rule(refuse, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    flt.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    return flt


def bpf_fd() -> int:
    """A file descriptor at the start of the filter's BPF, for bwrap's ``--seccomp``
    (inheritable; the caller closes it after starting bwrap)."""
    with tempfile.TemporaryFile() as out:
        build_filter().export_bpf(out)
        out.flush()
        fd = os.dup(out.fileno())
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd
