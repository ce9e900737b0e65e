"""The jail's seccomp filter (installer/jail/seccomp.py): its rules as libseccomp exports
them, and the filter loaded in a child process of the test (the jail's attack tests:
tests/attacks/test_jail_seccomp.py, test_jail_cgroups.py, test_jail.py)."""

from __future__ import annotations

import errno
import re
import subprocess
import sys
import tempfile

import pytest

from installer.jail import seccomp as jail_seccomp


def _pfc() -> str:
    with tempfile.TemporaryFile("w+") as out:
        jail_seccomp.build_filter().export_pfc(out)
        out.seek(0)
        return out.read()


def test_every_refused_syscall_answers_eperm_on_x86_64():
    native = _pfc().split("# filter for arch x86 ")[0]
    for name in jail_seccomp.REFUSED:
        rule = re.search(rf'syscall "{re.escape(name)}" \((\d+)\).*?action (\S+);', native, re.S)
        if rule is None and name in ("_sysctl", "uselib", "ustat", "sysfs"):
            continue  # gone from newer x86_64 syscall tables: nothing to refuse there
        assert rule and rule[2] == f"ERRNO({errno.EPERM})", (name, rule and rule[0])
    assert re.search(r'"clone3".*?action ERRNO\(38\);', native, re.S)


@pytest.mark.skipif(sys.platform != "linux", reason="seccomp is Linux's")
def test_loaded_it_refuses_namespaces_and_keyrings_and_allows_a_plain_fork():
    """A child loads the exported BPF itself (as bwrap does) and tries each call."""
    child = r"""
import ctypes, os, sys
from installer.jail import seccomp as jail_seccomp
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS, as bwrap has
jail_seccomp.build_filter().load()
def err(rc):
    return "ok" if rc >= 0 else os.strerror(ctypes.get_errno())
print("unshare", err(libc.unshare(0x10000000)))
print("clone-newuser", err(libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)))
print("clone3", err(libc.syscall(435, 0, 0)))
print("add_key", err(libc.syscall(248, b"user", b"ndi-unit", b"x", 1, -4)))
print("keyctl", err(libc.syscall(250, 0, -4, 0)))
print("mount", err(libc.mount(b"none", b"/", b"tmpfs", 0, None)))
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork", os.waitpid(pid, 0)[1] >> 8)
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    got = dict(line.split(" ", 1) for line in out.splitlines())
    assert got == {"unshare": "Operation not permitted", "clone-newuser": "Operation not permitted",
                   "clone3": "Function not implemented", "add_key": "Operation not permitted",
                   "keyctl": "Operation not permitted", "mount": "Operation not permitted",
                   "fork": "7"}, out


@pytest.mark.parametrize("failure", [
    "raise OSError('libseccomp.so.2: cannot open shared object file')",  # ctypes' CDLL
    "raise RuntimeError('Unable to find libseccomp')",
    "raise ImportError('no pyseccomp')",
])
def test_without_libseccomp_the_jail_refuses_to_start_with_one_line(monkeypatch, tmp_path, failure):
    """No libseccomp.so.2 (pyseccomp raises on import): the installer still starts (the
    binding loads only when a jail starts), and the jail, never run without its filter,
    ends with one line naming the package."""
    (tmp_path / "pyseccomp.py").write_text(failure + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pyseccomp", raising=False)
    with pytest.raises(SystemExit) as exc:
        jail_seccomp.bpf_fd()
    assert "libseccomp2" in str(exc.value) and "\n" not in str(exc.value)
