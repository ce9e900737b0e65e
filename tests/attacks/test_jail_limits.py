"""Issue 33 item 5: the jail's bounds. A .run header that starts processes until it cannot
and reports the tmpfs mounts it was given: the processes stop at the jail's pids cgroup,
every writable tmpfs has a size, / and /dev are read-only.

On main before the fix (checked on abf8713): all 300 processes started and /, /tmp, /root,
/run and /dev were writable tmpfs without a size.
"""

from __future__ import annotations

import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from installer.base.errors import BuildError
from installer.driver import nvidia_run
from installer.host.runner import Runner
from tests.attacks.payloads import fork_loop

pytestmark = pytest.mark.chroot

NAME = "NVIDIA-Linux-x86_64-550.54.14.run"
TRIES = 300
LIMIT = 64  # the test's bound: low, so the fork loop stays cheap
# makeself's variables (it passes the header check), then the attack; one line of findings.
GREEDY_RUN = f"""#!/bin/sh
CRCsum="0"
label="NVIDIA Accelerated Graphics Driver for Linux-x86_64 550.54.14"
skip="1"
python3 - <<'EOF'
import os, time
{fork_loop(TRIES)}mounts = [ln.split() for ln in open("/proc/self/mountinfo")]
unsized = sorted(m[4] for m in mounts if m[m.index("-") + 1] == "tmpfs"
                 and m[5].split(",")[0] == "rw" and "size=" not in m[-1])
dev_rw = any(m[4] == "/dev" and m[5].split(",")[0] == "rw" for m in mounts)
print(f"jail-limits: started {{started}}; unsized writable tmpfs {{unsized}}; /dev rw {{dev_rw}}")
EOF
exit 1
"""


def test_a_fork_bomb_stops_at_the_jail_and_every_tmpfs_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(nvidia_run, "JAIL_PIDS_MAX", LIMIT, raising=False)
    run_file = tmp_path / "downloads" / NAME
    run_file.parent.mkdir()
    run_file.write_text(GREEDY_RUN)
    (tmp_path / "staging").mkdir()
    with pytest.raises(BuildError) as failed:
        nvidia_run.extract(Runner(), run_file, tmp_path / "staging" / "extract")
    found = re.search(r"jail-limits: started (\d+); unsized writable tmpfs (\[.*?\]); /dev rw (\w+)",
                      str(failed.value))
    assert found, str(failed.value)
    assert int(found[1]) < LIMIT, found[0]  # the shell and python count too
    assert found[2] == "[]", found[0]
    assert found[3] == "False", found[0]


# Issue 39 J2/J3: where the jail's processes are while it runs, seen from outside.
WAITING_RUN = """#!/bin/sh
CRCsum="0"
label="NVIDIA Accelerated Graphics Driver for Linux-x86_64 550.54.14"
skip="1"
echo "jail-cgroups: $(cat /proc/self/cgroup | tr '\\n' ' ')"
sleep @NAP@
exit 1
"""


def _cgroups_of(argv: bytes, deadline: float) -> list[str]:
    """/proc/PID/cgroup of the process running ``argv`` (NUL-separated), once there is one."""
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and (proc / "cmdline").read_bytes() == argv:
                    return (proc / "cgroup").read_text().splitlines()
            except OSError:
                continue
        time.sleep(0.05)
    raise AssertionError(f"no process {argv!r} appeared")


@pytest.mark.skipif(not Path("/sys/fs/cgroup/pids").is_dir(), reason="needs the v1 pids hierarchy")
def test_the_jail_is_below_its_limit_in_every_hierarchy(tmp_path):
    """In every hierarchy the jail's processes are in ``ndi-jail-<id>/jail``, the root of
    its cgroup namespace (its own /proc/self/cgroup shows ``/`` everywhere), and the
    limit is on ``ndi-jail-<id>``, one level above: out of its view. On main (aa59460)
    only the pids hierarchy had a child, the jail in it with the limit on it."""
    nap = f"5.{uuid.uuid4().int % 10**9:09d}"  # the jail's sleep, told from any other
    run_file = tmp_path / "downloads" / NAME
    run_file.parent.mkdir()
    run_file.write_text(WAITING_RUN.replace("@NAP@", nap))
    (tmp_path / "staging").mkdir()
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(nvidia_run.extract, Runner(), run_file, tmp_path / "staging" / "x")
        lines = _cgroups_of(b"sleep\0" + nap.encode() + b"\0", time.monotonic() + 60)
        pids_path = next(ln.split(":", 2)[2] for ln in lines if ln.split(":")[1] == "pids")
        jail = Path("/sys/fs/cgroup/pids") / pids_path.lstrip("/")
        limits = [(d / "pids.max").read_text().strip() if (d / "pids.max").exists() else None
                  for d in (jail.parent, jail)]
        with pytest.raises(BuildError) as failed:
            job.result(timeout=60)
    assert jail.name == "jail" and jail.parent.name.startswith("ndi-jail-"), pids_path
    assert limits == [str(nvidia_run.JAIL_PIDS_MAX), "max"], limits
    ours = {ln.split(":", 2)[1] for ln in Path("/proc/self/cgroup").read_text().splitlines()}
    assert {ln.split(":", 2)[1] for ln in lines} == ours, lines
    outside = [ln for ln in lines if not ln.endswith(f"/{jail.parent.name}/jail")]
    assert outside == [], f"the jail is outside {jail.parent.name}/jail in: {outside}"
    seen = re.search(r"jail-cgroups: (.*)", str(failed.value))
    assert seen and all(e.endswith(":/") for e in seen[1].split()), str(failed.value)
