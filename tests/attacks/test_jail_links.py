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
from tests.attacks.test_jail import attack_header, attack_script

pytestmark = pytest.mark.chroot

SECRET = "host-secret-5d1f0a"
RUN_REAL = '"$(dirname "$0")/.nvidia-installer-real" "$@" || exit $?'
TRICK = 'python3 "$(dirname "$0")/.attack.py" nvidia-installer {} || exit 1'


def _tricked_run(tmp_path, *, header: str = "", installer: str = ""):
    script = attack_script()
    return doctored_run(tmp_path / "run", header=header, installer=installer,
                        files={".attack.py": script})


def test_the_header_cannot_plant_a_link_in_the_staging_dir(ubuntu, tmp_path):
    """Item 2: the extract jail's writable dir is a fresh one, not the staging dir."""
    ubuntu.server.serve_run(V, _tricked_run(
        tmp_path, header=attack_header(attack_script(), "header", "staging-link")))
    proc = ubuntu.run("install")
    outcome(proc, 7, "lib64", "nothing was installed")
    ubuntu.assert_host_unchanged()


def test_the_harvest_never_follows_a_link_the_installer_left(ubuntu, tmp_path):
    """Item 3: the upper dir is walked from the top with O_NOFOLLOW; a link where a dir
    of the install layout belongs fails the install instead of moving the host's files."""
    ubuntu.server.serve_run(V, _tricked_run(
        tmp_path, installer=f"{RUN_REAL}\n{TRICK.format('harvest-link')}"))
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
    ubuntu.server.serve_run(V, _tricked_run(
        tmp_path, installer=f"{TRICK.format('log-link')}\nexit 1"))
    proc = ubuntu.run("install")
    leaked = [str(p) for p in ubuntu.node.install_dir.rglob("*")
              if p.is_file() and not p.is_symlink() and SECRET in p.read_text(errors="replace")]
    assert leaked == []
    assert SECRET not in proc.stderr + proc.stdout
    outcome(proc, 7, "/var/log/nvidia-installer.log is a link")
    ubuntu.assert_host_unchanged()
