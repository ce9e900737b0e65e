"""Issue 33 item 5: the jail's bounds. A .run header that starts processes until it cannot
and reports the tmpfs mounts it was given: the processes stop at the jail's pids cgroup,
every writable tmpfs has a size, / and /dev are read-only.

On main before the fix (checked on abf8713): all 300 processes started and /, /tmp, /root,
/run and /dev were writable tmpfs without a size.
"""

from __future__ import annotations

import re

import pytest

from installer import nvidia_run
from installer.errors import BuildError
from installer.runner import Runner

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
started = 0
for _ in range({TRIES}):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)  # the jail's PID namespace ends them all when the header exits
        os._exit(0)
    started += 1
mounts = [ln.split() for ln in open("/proc/self/mountinfo")]
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
