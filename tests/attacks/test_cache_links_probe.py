"""Issue 39 C1: a cache hit must not load an unchecked libcuda, and the CUDA check's child
must be bounded: its output, its children, its missing entry points.

- The record covers the links the loader follows (cache.LOADER_LINKS and every soname
  link): ``lib64/libcuda.so.1`` replaced by a planted .so is no cache hit, the install is
  made again, and the planted library's constructor never runs.
- The probe runs as pid 1 of a pid namespace of its own (cuda_check.probe_argv): a child
  libcuda's constructor started that left the session (setsid) dies with it.
- What the probe and libcuda print reaches the installer as a bounded tail.
- A libcuda.so.1 without an entry point the probe calls is a one-line error naming it.

On main before the fix (aa59460): the planted .so was a cache_hit and ran as root in the
CUDA check; the setsid'd grandchild outlived the check; the installer read all 32 MiB the
library printed; the missing entry point ended in ``… ^^^^^^^^ AttributeError: …``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from installer.base.errors import VerifyError
from installer.host.runner import CommandResult, Runner
from installer.kmod.kernel import KernelState
from installer.services import cuda_check, cuda_probe
from tests.attacks.conftest import event_names, outcome

# The probe runs in a pid namespace of its own (unshare --pid): root, as the installer is.
pytestmark = pytest.mark.chroot

PLANTED = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("planted libcuda ran\n", f); fclose(f); }
}
int cuInit(unsigned flags) { return 0; }
"""

# A libcuda with cuInit, cuDriverGetVersion and cuDeviceGetCount (one device) and nothing
# else: the probe's next call, cuDeviceGet, is missing. Its constructor may also leave a
# grandchild in a session of its own (LEAVE_CHILD) and print SPEW bytes.
PARTIAL = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void start(void) {
#ifdef LEAVE_CHILD
    if (fork() == 0) {
        setsid();
        if (fork() == 0) {
            char pid[32] = {0};  /* /proc/self: its pid as the host's procfs names it */
            if (readlink("/proc/self", pid, sizeof pid - 1) < 0) _exit(1);
            FILE *f = fopen(LEAVE_CHILD, "w");
            fprintf(f, "%s\n", pid); fclose(f);
            for (int i = 0; i < 600; i++) sleep(1);
        }
        _exit(0);
    }
#endif
#ifdef SPEW
    static char line[64];
    memset(line, 'x', 63); line[63] = '\n';
    for (long n = 0; n < SPEW / 64; n++) fwrite(line, 1, 64, stdout);
    fflush(stdout);
#endif
}
int cuInit(unsigned flags) { return 0; }
int cuDriverGetVersion(int *v) { *v = 12040; return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
"""


def _shared_object(out: Path, source: str, *defines: str) -> Path:
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", *(f"-D{d}" for d in defines), "-o", str(out),
                    str(src)], check=True, capture_output=True, text=True)
    return out


def test_a_planted_libcuda_link_is_no_cache_hit(ubuntu, tmp_path):
    """The record names lib64/libcuda.so.1 as a link to the hashed libcuda.so.<V>: a
    regular file in its place makes the cache broken, the driver is installed again, and
    the CUDA check loads the digest-checked file, never the planted one."""
    outcome(ubuntu.run("install"), 0)
    marker = ubuntu.node.path("/planted-libcuda-ran")
    link = ubuntu.node.install_dir / "lib64/libcuda.so.1"
    target = os.readlink(link)
    planted = _shared_object(tmp_path / "planted.so", PLANTED,
                             f'MARKER="/root/{marker.relative_to(ubuntu.node.root)}"')
    link.unlink()
    planted.rename(link)
    proc = ubuntu.run("install")
    outcome(proc, 0)
    assert "cache_hit" not in event_names(proc), proc.stderr[-3000:]
    assert not marker.exists(), "the planted libcuda.so.1 ran"
    assert os.readlink(link) == target


def _lib64(tmp_path: Path, *defines: str) -> Path:
    lib64 = tmp_path / "lib64"
    lib64.mkdir()
    _shared_object(lib64 / "libcuda.so.550.54.14", PARTIAL, *defines)
    (lib64 / "libcuda.so.1").symlink_to("libcuda.so.550.54.14")
    return lib64


def _kernel(tmp_path: Path) -> KernelState:
    return KernelState(proc_dir=tmp_path / "proc", sys_dir=tmp_path / "sys")


def test_a_missing_entry_point_is_one_clean_line(tmp_path):
    lib64 = _lib64(tmp_path)
    with pytest.raises(VerifyError) as err:
        cuda_check.check(lib64, _kernel(tmp_path), Runner(), [], deadline_s=30)
    message = str(err.value)
    assert "cuDeviceGet" in message and "\n" not in message, message
    assert "Traceback" not in message and "^^^" not in message and "Error:" not in message


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as f:  # a zombie no one reaps yet is gone too
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        time.sleep(0.05)
    return False


def test_a_child_that_left_the_session_dies_with_the_probe(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    lib64 = _lib64(tmp_path, f'LEAVE_CHILD="{pid_file}"')
    with pytest.raises(VerifyError):
        cuda_check.check(lib64, _kernel(tmp_path), Runner(), [], deadline_s=30)
    deadline = time.monotonic() + 5
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the constructor left no child"
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    try:
        assert _gone(pid), f"pid {pid}, which left the probe's session, outlived the check"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


class _Spy(Runner):
    """A Runner that keeps what each command printed, as the installer received it."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[int] = []

    def run(self, *args, **kw) -> CommandResult:
        res = super().run(*args, **kw)
        self.outputs.append(len(res.stdout) + len(res.stderr))
        return res


def test_what_libcuda_prints_reaches_the_installer_bounded(tmp_path):
    lib64 = _lib64(tmp_path, f"SPEW={32 << 20}")
    spy = _Spy()
    with pytest.raises(VerifyError) as err:
        cuda_check.check(lib64, _kernel(tmp_path), spy, [], deadline_s=60)
    bound = getattr(cuda_probe, "OUTPUT_MAX_BYTES", 64 << 10)  # (main has none)
    assert spy.outputs and max(spy.outputs) <= bound + 4096, spy.outputs
    assert "cuDeviceGet" in str(err.value)  # the JSON line, last, survived the bound
