"""Issue 39, the lock trap: a non-root run must leave nothing in the host's /tmp that
blocks the DaemonSet's root runs, and a lock file no live process holds is taken over.

On main before the fix (aa59460): the run as nobody created /tmp/cos_gpu_installer_lock
owned by 65534 before it failed its privilege check (exit 2), and every later root run
refused it ("owned by uid 65534, not by us", exit 4) until a person deleted it.
"""

from __future__ import annotations

import os

import pytest

from tests.attacks.conftest import event_names, outcome

pytestmark = pytest.mark.chroot

LOCK = "/tmp/cos_gpu_installer_lock"


def test_a_non_root_run_leaves_no_lock_that_blocks_root(ubuntu):
    proc = ubuntu.run("install", module="tests.attacks.as_nobody")
    outcome(proc, 2, "needs root privileges")
    assert not ubuntu.node.path(LOCK).exists() and not ubuntu.node.path(LOCK).is_symlink()
    outcome(ubuntu.run("install"), 0)
    ubuntu.assert_host_unchanged(installed=True)


@pytest.mark.parametrize("plant", ["other_user", "symlink"])
def test_a_lock_file_no_process_holds_is_taken_over(ubuntu, plant):
    """Another user's stale lock (what a non-root run left before the fix), or a link to a
    host file: replaced by the root run, the file it names untouched."""
    lock = ubuntu.node.path(LOCK)
    victim = ubuntu.node.path("/etc/ndi-victim")
    victim.write_text("precious\n")
    if plant == "symlink":
        lock.symlink_to("/etc/ndi-victim")
    else:
        lock.write_text("4242\n")
        os.chown(lock, 65534, 65534)
    ubuntu.snapshot()
    proc = ubuntu.run("install")
    outcome(proc, 0)
    assert "lock_file_replaced" in event_names(proc)
    assert not lock.is_symlink() and lock.stat().st_uid == 0
    assert victim.read_text() == "precious\n"
    ubuntu.assert_host_unchanged(installed=True)
