"""Issue 39 K1 and issue 43: forged kernel-log lines, and the machine's kernel log in tests.

Anyone can put text in the kernel log. A write to /dev/kmsg is logged with facility LOG_USER
(1), never LOG_KERN (Documentation/ABI/testing/dev-kmsg: "It is not possible to inject
messages from userspace with the facility number LOG_KERN (0)"); and an unprivileged user in
a user namespace makes the kernel itself log their text: ``mount -t tmpfs -o 'NVRM: Xid ...'``
logs ``tmpfs: Unknown parameter 'NVRM: Xid ...'`` at KERN_ERR (fs/fs_context.c,
vfs_parse_fs_param: ``invalf(fc, "%s: Unknown parameter '%s'", ...)``). Before, doctor read
either as "GPU has fallen off the bus: reboot", and a failed load quoted it as the driver's
words. Each attack below holds the forged records in the node's /dev/kmsg, and a ``dmesg``
on PATH prints the same log (util-linux's formats: ``--raw`` keeps ``<prio>``), so both of
the old and new read paths see them. Every test here failed on main before the fix.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from installer.host.runner import Runner
from installer.kmod.kernel import KernelState


def _tripwire():
    """The tripwire module the session armed (tests/fixtures/pytest_plugin.py put its
    directory on sys.path): the same module object, so ``expect()`` reaches its hook."""
    import kernellog_tripwire

    return kernellog_tripwire


XID79 = "NVRM: Xid (PCI:0000:00:04): 79, GPU has fallen off the bus."
FORGED = [
    # prio 3 = LOG_KERN << 3 | KERN_ERR: the kernel quoting a user's mount option.
    (3, f"tmpfs: Unknown parameter '{XID79}'"),
    (3, "tmpfs: Unknown parameter 'NVRM: GPU0 GSP RPC timeout \\x1b[2J'"),
    # prio 12 = LOG_USER << 3 | KERN_WARNING: echo 'NVRM: ...' > /dev/kmsg.
    (12, XID79),
    (12, "NVRM: GSP error: forged by a user"),
]


def _node(tmp_path: Path, monkeypatch, records: list[tuple[int, str]]) -> KernelState:
    """A kernel whose log holds ``records``, with a dmesg on PATH that prints the same."""
    dev, bin_dir = tmp_path / "dev", tmp_path / "bin"
    dev.mkdir()
    bin_dir.mkdir()
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/modules").write_text("")
    kmsg = "".join(f"{prio},{seq},{seq * 1000},-;{msg}\n" for seq, (prio, msg) in
                   enumerate(records))
    (dev / "kmsg").write_text(kmsg)
    raw = "".join(f"<{prio}>[    0.{seq:06d}] {msg}\n" for seq, (prio, msg) in
                  enumerate(records))
    (bin_dir / "log.raw").write_text(raw)
    (bin_dir / "log.txt").write_text("".join(f"[    0.{seq:06d}] {msg}\n" for seq, (_, msg) in
                                             enumerate(records)))  # plain dmesg: no <prio>
    (bin_dir / "dmesg").write_text(
        f'#!/bin/sh\ncase "$*" in *--raw*) cat {bin_dir}/log.raw ;; *) cat {bin_dir}/log.txt ;; '
        "esac\n")
    (bin_dir / "dmesg").chmod(0o755)
    (bin_dir / "insmod").write_text(
        '#!/bin/sh\necho "insmod: ERROR: could not insert module $1: No such device" >&2\n'
        "exit 1\n")
    (bin_dir / "insmod").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return KernelState(tmp_path / "proc", tmp_path / "sys", dev)


def test_forged_xid_lines_do_not_fail_doctor(tmp_path, monkeypatch):
    from installer.commands.doctor.workload import check_kernel_log

    kernel = _node(tmp_path, monkeypatch, FORGED)
    found = check_kernel_log(SimpleNamespace(kernel=kernel, runner=Runner()))
    assert found.verdict == "ok", found
    assert found.detail.startswith("0 NVIDIA Xid/GSP line(s)"), found


def test_the_drivers_own_xid_still_fails_doctor(tmp_path, monkeypatch):
    """The filter keeps what it must: the same line, logged by the driver (facility 0)."""
    from installer.commands.doctor.workload import check_kernel_log

    kernel = _node(tmp_path, monkeypatch, [*FORGED, (4, XID79)])
    found = check_kernel_log(SimpleNamespace(kernel=kernel, runner=Runner()))
    assert found.verdict == "fail" and "Xid 79" in found.detail, found
    assert found.fix == "drain the node, then reboot it"


def test_a_failed_load_quotes_the_drivers_words_not_a_forged_line(tmp_path, monkeypatch):
    from installer.base.errors import ModuleLoadError
    from installer.kmod.modules import ModuleLoad, load

    kernel = _node(tmp_path, monkeypatch, [(4, "NVRM: No NVIDIA GPU found."), *FORGED])
    ko = tmp_path / "nvidia.ko"
    ko.write_bytes(b"")
    with pytest.raises(ModuleLoadError) as err:
        load([ModuleLoad("nvidia", ko, (), ())], kernel, Runner(), modprobe_root=None)
    assert err.value.message.endswith("(kernel: NVRM: No NVIDIA GPU found.)"), err.value.message
    assert err.value.context["kernel_log"] == ["[    0.000000] NVRM: No NVIDIA GPU found."]


def test_the_failure_tail_shows_no_forged_line(tmp_path, monkeypatch):
    from installer.kmod import diagnostics

    kernel = _node(tmp_path, monkeypatch,
                   [(4, "nvidia: Unknown symbol nvlink_core_init (err -2)"), *FORGED])
    assert diagnostics.kernel_log_tail(kernel, Runner()) == [
        "[    0.000000] nvidia: Unknown symbol nvlink_core_init (err -2)"]


# --- issue 43: the default tier never reads the machine's kernel log ---------------------


def test_this_test_process_cannot_read_the_machines_kernel_log():
    """The tripwire is armed in the default tier: /dev/kmsg and the system's dmesg are refused
    (and a test that hit them would fail the session, see tests/fixtures/pytest_plugin.py)."""
    from installer.kmod import xid

    kernellog_tripwire = _tripwire()
    assert os.environ.get(kernellog_tripwire.TRIPWIRE_ENV), "the tripwire is not armed"
    with kernellog_tripwire.expect(), pytest.raises(kernellog_tripwire.RealKernelLogRead):
        xid.read_kmsg(Path("/dev/kmsg"))
    with kernellog_tripwire.expect(), pytest.raises(kernellog_tripwire.RealKernelLogRead):
        Runner().run(["dmesg"], timeout=10, check=False)


def test_a_child_on_a_fake_kernel_cannot_read_the_machines_kernel_log(tmp_path, fake_kernel):
    """Every Python child pointed at a fake kernel (the CLI, the pod's installer) has it too,
    and notes the read for the session."""
    kernellog_tripwire = _tripwire()
    note = tmp_path / "tripwire"
    env = {**fake_kernel.subprocess_env(), kernellog_tripwire.TRIPWIRE_ENV: str(note)}
    proc = subprocess.run([sys.executable, "-c", "import os; os.open('/dev/kmsg', os.O_RDONLY)"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode != 0 and "RealKernelLogRead" in proc.stderr, proc.stderr[-2000:]
    assert "read the machine's kernel log (/dev/kmsg)" in note.read_text()
