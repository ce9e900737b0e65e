"""Issue 39 J2/J3: the container's own cgroups, out of the jail's reach.

The container here is a throwaway cgroup of the test's own in the v1 memory and freezer
hierarchies (its memory limit a value nothing else has), holding only a Python that
runs a .run header in the real jail (nvidia_run.extract, as in the pod): if the jail
freezes "its container", it freezes that process and the jail, never the test runner,
which sees ``freezer.state`` change, thaws it and fails. The header looks for the
container's cgroup files where the jail's /sys shows them, then as the issue did:
unshare(CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWCGROUP), mounts the v1 memory and freezer
hierarchies (rooted at its cgroup-namespace root), opens ``memory.limit_in_bytes`` for
writing and writes FROZEN to ``freezer.state``.

On main before the fix (aa59460): the jail saw the container's files under
/sys/fs/cgroup, opened its memory.limit_in_bytes for writing, and froze it (thawed by
this test). After it: /sys/fs/cgroup is an empty read-only tmpfs in the jail, unshare is
refused (jail/seccomp.py), and the jail's cgroup-namespace root is ``ndi-jail-*/jail``
in every hierarchy (jail/limits.py).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.chroot

REPO = Path(__file__).resolve().parents[2]
LIMIT = (6 << 30) + 777 * 4096  # the container's memory limit: no other cgroup has it
WAIT_S = 120
HEADER = """#!/bin/sh
CRCsum="0"
label="NVIDIA Accelerated Graphics Driver for Linux-x86_64 550.54.14"
skip="1"
python3 - <<'EOF'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
BOX, LIMIT = "@BOX@", "@LIMIT@"
found = []
for dirpath, _dirs, files in os.walk("/sys/fs/cgroup"):
    if BOX in dirpath:
        found.append("seen " + dirpath)
        break
if libc.unshare(0x10000000 | 0x00020000 | 0x02000000) != 0:
    found.append("unshare: " + os.strerror(ctypes.get_errno()))
else:
    for name in ("memory", "freezer"):
        os.makedirs("/tmp/" + name, exist_ok=True)
        if libc.mount(b"cgroup", b"/tmp/" + name.encode(), b"cgroup", 0, name.encode()):
            found.append("mount " + name + ": " + os.strerror(ctypes.get_errno()))
    try:
        if open("/tmp/memory/memory.limit_in_bytes").read().strip() == LIMIT:
            os.close(os.open("/tmp/memory/memory.limit_in_bytes", os.O_WRONLY))
            found.append("opened the container's memory.limit_in_bytes for writing")
    except OSError as exc:
        found.append("memory.limit_in_bytes: " + exc.strerror)
    try:
        with open("/tmp/freezer/freezer.state", "w") as f:
            f.write("FROZEN")
        found.append("wrote FROZEN")
    except OSError as exc:
        found.append("freezer.state: " + exc.strerror)
print("j23: " + "; ".join(found))
EOF
exit 1
"""
EXTRACT = """
import sys
from pathlib import Path
from installer.driver import nvidia_run
from installer.base.errors import BuildError
from installer.host.runner import Runner
try:
    nvidia_run.extract(Runner(), Path(sys.argv[1]), Path(sys.argv[2]))
except BuildError as exc:
    print(exc)
"""


def _own(controller: str) -> Path | None:
    """Our cgroup in the v1 ``controller`` hierarchy (the test's own reading: it runs
    against main's code too)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        base = Path("/sys/fs/cgroup") / controller
        if controller in controllers.split(",") and base.is_dir():
            return base / path.lstrip("/")
    return None


@contextlib.contextmanager
def _container(name: str):
    """The throwaway 'container': a child of ours in the memory and freezer hierarchies."""
    boxes = [_own("memory") / name, _own("freezer") / name]
    try:
        for box in boxes:
            box.mkdir()
        (boxes[0] / "memory.limit_in_bytes").write_text(str(LIMIT))
        yield boxes
    finally:
        with contextlib.suppress(OSError):
            (boxes[1] / "freezer.state").write_text("THAWED")
        for box in boxes:
            for _ in range(200):  # its last processes may still be exiting
                with contextlib.suppress(FileNotFoundError):
                    try:
                        box.rmdir()
                    except OSError:
                        time.sleep(0.05)
                        continue
                break


def _run_in(boxes: list[Path], argv: list[str]) -> tuple[str, bool]:
    """Run ``argv`` in the container; its output, and whether it was ever frozen (then
    thawed here, so the run ends)."""
    def enter() -> None:
        for box in boxes:
            (box / "cgroup.procs").write_text("0")

    state = boxes[1] / "freezer.state"
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=enter)
    frozen = False
    try:
        deadline = time.monotonic() + WAIT_S
        while proc.poll() is None and time.monotonic() < deadline:
            if state.read_text().strip() != "THAWED":
                frozen = True
                state.write_text("THAWED")
            time.sleep(0.05)
    finally:
        state.write_text("THAWED")
        if proc.poll() is None:
            proc.kill()
        out = proc.communicate(timeout=WAIT_S)[0].decode(errors="replace")
    return out, frozen


@pytest.mark.skipif(_own("memory") is None or _own("freezer") is None,
                    reason="J2/J3 attack the cgroup v1 memory and freezer hierarchies: none here")
def test_the_jail_cannot_reach_its_containers_memory_limit_or_freezer(tmp_path):
    name = f"ndi-attack-{uuid.uuid4().hex[:12]}"
    run_file = tmp_path / "downloads" / "NVIDIA-Linux-x86_64-550.54.14.run"
    run_file.parent.mkdir()
    run_file.write_text(HEADER.replace("@BOX@", name).replace("@LIMIT@", str(LIMIT)))
    (tmp_path / "staging").mkdir()
    with _container(name) as boxes:
        out, frozen = _run_in(boxes, [sys.executable, "-c", EXTRACT, str(run_file),
                                      str(tmp_path / "staging" / "extract")])
    found = re.search(r"j23: (.*)", out)
    assert not frozen, f"the jail froze its container: {found[0] if found else out[-2000:]}"
    assert found, out[-3000:]
    assert found[1] == "unshare: Operation not permitted", found[0]
