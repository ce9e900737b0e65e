"""Issue 39 J1 and J4: what the jail's seccomp filter (installer/jail/seccomp.py) refuses,
tried from a .run header in the real jail (nvidia_run.extract, as in the pod).

J1: Python calls unshare(CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWCGROUP) itself (no uid map
written: still kernel uid 0, admin over its new namespaces), mounts a v1 pids hierarchy
(its cgroup-namespace root is the jail's own cgroup), writes ``max`` to ``pids.max`` and
forks past the bound. J4: add_key("user", ..., KEY_SPEC_USER_KEYRING) lands in root's
user keyring (keyrings are not namespaced) and outlives the jail.

On main before the fix (aa59460, checked on this machine's 6.18 kernel with hybrid
cgroups): J1 started all 200 processes past the bound of 64; J4's key was in
/proc/keys after the jail had gone.
"""

from __future__ import annotations

import ctypes
import re
import uuid
from pathlib import Path

import pytest

from installer.base.errors import BuildError
from installer.driver import nvidia_run
from installer.host.runner import Runner
from tests.attacks.payloads import fork_loop

pytestmark = pytest.mark.chroot

NAME = "NVIDIA-Linux-x86_64-550.54.14.run"
LIMIT, TRIES = 64, 200
HEADER = """#!/bin/sh
CRCsum="0"
label="NVIDIA Accelerated Graphics Driver for Linux-x86_64 550.54.14"
skip="1"
python3 - <<'EOF'
{python}
EOF
exit 1
"""
# J1, as the issue reproduced it.
LIFT_PIDS = f"""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUSER = 0x00020000, 0x02000000, 0x10000000
steps = []
if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWCGROUP) != 0:
    steps.append("unshare: " + os.strerror(ctypes.get_errno()))
else:
    steps.append("unshare: done")
    os.makedirs("/tmp/cg", exist_ok=True)
    if libc.mount(b"cgroup", b"/tmp/cg", b"cgroup", 0, b"pids") != 0:
        steps.append("mount: " + os.strerror(ctypes.get_errno()))
    else:
        try:
            with open("/tmp/cg/pids.max", "w") as f:
                f.write("max")
            steps.append("pids.max: max")
        except OSError as exc:
            steps.append("pids.max: " + exc.strerror)
{fork_loop(TRIES)}print(f"j1: started {{started}}; {{'; '.join(steps)}}")
"""
KEY_SPEC_USER_KEYRING = -4
ADD_KEY = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
key = libc.syscall(248, b"user", b"@DESC@", b"jail was here", 13, -4)  # add_key(2)
print("j4: add_key " + (f"gave key {key}" if key > 0 else os.strerror(ctypes.get_errno())))
"""


def _extract(tmp_path: Path, python: str) -> str:
    run_file = tmp_path / "downloads" / NAME
    run_file.parent.mkdir()
    run_file.write_text(HEADER.format(python=python))
    (tmp_path / "staging").mkdir()
    with pytest.raises(BuildError) as failed:
        nvidia_run.extract(Runner(), run_file, tmp_path / "staging" / "extract")
    return str(failed.value)


def _v1_pids() -> bool:
    return any(line.split(":")[1] == "pids" for line in Path("/proc/self/cgroup").read_text()
               .splitlines()) and Path("/sys/fs/cgroup/pids").is_dir()


@pytest.mark.skipif(not _v1_pids(), reason="J1 lifts a cgroup v1 pids limit: none here")
def test_the_jail_cannot_lift_its_pids_limit_from_a_user_namespace(tmp_path, monkeypatch):
    monkeypatch.setattr(nvidia_run, "JAIL_PIDS_MAX", LIMIT)
    message = _extract(tmp_path, LIFT_PIDS)
    found = re.search(r"j1: started (\d+); (.*)", message)
    assert found, message
    assert found[2] == "unshare: Operation not permitted", found[0]
    assert int(found[1]) < LIMIT, found[0]


def _key_ids(description: str) -> list[int]:
    """The keys /proc/keys lists under ``description`` (root may view its own)."""
    return [int(line.split()[0], 16) for line in Path("/proc/keys").read_text().splitlines()
            if line.rstrip().endswith(f"{description}: 13")]


def test_the_jail_cannot_add_a_key_to_roots_keyring(tmp_path):
    description = f"ndi-attack-{uuid.uuid4().hex[:12]}"
    try:
        message = _extract(tmp_path, ADD_KEY.replace("@DESC@", description))
        left = _key_ids(description)
    finally:
        keyctl = ctypes.CDLL(None, use_errno=True).syscall
        for key in _key_ids(description):
            keyctl(250, 21, key)  # keyctl(KEYCTL_INVALIDATE, key): the test leaves none
    assert left == [], f"the jail's key is in root's keyring: {left}"
    assert "j4: add_key Operation not permitted" in message, message
