"""Issue 33 items 2-4: links NVIDIA's code leaves for our code, outside the jail, to follow.

The jail cannot reach the node, but what it writes is moved and read afterwards by us, as
root, in the container, where the host root is at /root: a link planted where we expect a
directory or a log sends that move or read to the host. Each .run here installs the stock
payload but leaves one such link; the install must refuse it (exit 7, naming it), change
nothing on the host and copy nothing of the file it names anywhere.

On main before the fix (checked on abf8713): the header's ``lib64 -> /root/etc`` in the
staging dir put nvidia-installer's libraries into the host's /etc; the upper dir's
``usr/lib/firmware/nvidia -> /root/etc`` moved the host's /etc files into the install
dir; the failure log ``/var/log/nvidia-installer.log -> /root/etc/<secret>`` copied the
secret into nvidia-installer.failed.log, status.json and the final message.
"""

from __future__ import annotations

import pytest

from tests.attacks.conftest import V, doctored_run, outcome

pytestmark = pytest.mark.chroot

SECRET = "host-secret-5d1f0a"
STAGING_IN_JAIL = "/tmp/nvidia-driver-installer/out"  # nvidia_run.OUT_IN_CHROOT


def test_the_header_cannot_plant_a_link_in_the_staging_dir(ubuntu, tmp_path):
    """Item 2: the extract jail's writable dir is a fresh one, not the staging dir."""
    run = doctored_run(tmp_path / "run", header=f"ln -s /root/etc {STAGING_IN_JAIL}/lib64")
    ubuntu.server.serve_run(V, run)
    proc = ubuntu.run("install")
    outcome(proc, 7, "lib64", "nothing was installed")
    ubuntu.assert_host_unchanged()


def test_the_harvest_never_follows_a_link_the_installer_left(ubuntu, tmp_path):
    """Item 3: the upper dir is walked from the top with O_NOFOLLOW; a link where a dir
    of the install layout belongs fails the install instead of moving the host's files."""
    run = doctored_run(tmp_path / "run", installer=(
        '"$(dirname "$0")/.nvidia-installer-real" "$@" || exit $?\n'
        "rm -rf /usr/lib/firmware/nvidia /lib/firmware/nvidia\n"
        "ln -s /root/etc /usr/lib/firmware/nvidia"))
    ubuntu.server.serve_run(V, run)
    before = sorted(p.name for p in ubuntu.node.path("/etc").iterdir())
    proc = ubuntu.run("install")
    outcome(proc, 7, "/usr/lib/firmware/nvidia is a link")
    assert sorted(p.name for p in ubuntu.node.path("/etc").iterdir()) == before
    ubuntu.assert_host_unchanged()


def test_a_failure_log_that_is_a_link_is_not_read(ubuntu, tmp_path):
    """Item 4: nvidia-installer's log is copied only as a regular file: a link to a host
    file (a secret, bundle build's signing key) is never read into the failed log, the
    status record or the final message."""
    ubuntu.node.path("/etc/ndi-secret").write_text(f"{SECRET}\n")
    run = doctored_run(tmp_path / "run", installer=(
        "mkdir -p /var/log\n"
        "ln -sf /root/etc/ndi-secret /var/log/nvidia-installer.log\n"
        "exit 1"))
    ubuntu.server.serve_run(V, run)
    proc = ubuntu.run("install")
    leaked = [str(p) for p in ubuntu.node.install_dir.rglob("*")
              if p.is_file() and not p.is_symlink() and SECRET in p.read_text(errors="replace")]
    assert leaked == []
    assert SECRET not in proc.stderr + proc.stdout
    outcome(proc, 7, "/var/log/nvidia-installer.log is a link")
    ubuntu.assert_host_unchanged()
