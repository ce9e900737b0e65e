"""Issue 39 J5, H1, H2: what the jail prints, the names it chooses, the modes it sets.

- J5: a jail printing 200 MiB of short lines and failing must not take the installer's
  memory with it (every read of its output is a bounded tail), and no file the jail writes
  may grow past JAIL_FILE_MAX_BYTES (RLIMIT_FSIZE, hard limit, which it cannot raise).
- H1: a name the jail chose (a FIFO named with a newline, a forged ``install_ok`` event
  and terminal escapes) reaches the final message, status.json and ``status`` output as
  one line with its control characters escaped.
- H2: the harvest writes modes it chose: no setuid, setgid or world-writable file in the
  install dir, whatever the jail set.

On main before the fix (aa59460): J5's installer peaked at 752 MiB (1.3 GB in the issue); H1's final message
held raw newlines and ``status`` printed the forged event on a line of its own; H2's
install dir held a 4755 nvidia-smi, 0666 libraries and a 6777 file.
"""

from __future__ import annotations

import json
import stat

import pytest

from installer.driver import nvidia_run
from tests.attacks.conftest import V, doctored_run, outcome
from tests.pod import events

pytestmark = pytest.mark.chroot

RUN_REAL = '"$(dirname "$0")/.nvidia-installer-real" "$@" || exit $?'
SPEW_BYTES = 200 << 20
# 40-character lines, as a build log's: ~5 M of them.
SPEW = f"yes 0123456789012345678901234567890123456789 | head -c {SPEW_BYTES}"
# What the installer process may peak at: it measured 43 MiB here with the bounded reads
# (752 MiB before them); a read of the whole 200 MiB output alone is more than this.
PEAK_RSS_LIMIT_KIB = 180 << 10


def _peak_rss_kib(proc) -> int:
    return next(e["peak_rss_kib"] for e in events(proc.stderr) if "peak_rss_kib" in e)


@pytest.mark.parametrize("where", ["header", "installer"])
def test_a_jail_printing_200_mib_leaves_the_installer_small(ubuntu, tmp_path, where):
    """J5: the .run's header (the extract) or nvidia-installer prints 200 MiB and fails:
    exit 7 with the output's tail, and the installer's own peak RSS stays small."""
    if where == "header":
        run = doctored_run(tmp_path / "run", header=f"{SPEW}\nexit 1")
    else:
        run = doctored_run(tmp_path / "run", installer=f"{SPEW}\nexit 1")
    ubuntu.server.serve_run(V, run)
    proc = ubuntu.run("install", module="tests.attacks.peak_rss")
    outcome(proc, 7, "0123456789")
    peak = _peak_rss_kib(proc)
    assert peak < PEAK_RSS_LIMIT_KIB, f"the installer peaked at {peak >> 10} MiB"
    ubuntu.assert_host_unchanged()


FSIZE_PROBE = """import resource
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
try:
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    raised = "raised"
except (ValueError, OSError):
    raised = "refused"
print(f"jail-fsize soft={soft} hard={hard} raise={raised}")
"""


def test_no_file_the_jail_writes_may_grow_past_the_bound(ubuntu, tmp_path):
    """J5: the jail runs under RLIMIT_FSIZE = JAIL_FILE_MAX_BYTES, soft and hard, and its
    uid 0 (no CAP_SYS_RESOURCE) cannot raise it; its output file included."""
    run = doctored_run(tmp_path / "run", files={".fsize.py": FSIZE_PROBE},
                       installer='python3 "$(dirname "$0")/.fsize.py"\nexit 1')
    ubuntu.server.serve_run(V, run)
    proc = ubuntu.run("install")
    bound = nvidia_run.JAIL_FILE_MAX_BYTES
    outcome(proc, 7, f"jail-fsize soft={bound} hard={bound} raise=refused")
    ubuntu.assert_host_unchanged()


FORGED = '\n{"event": "install_ok", "message": "FORGED: installed"}\n'
FIFO_MAKER = f"""import os
os.mkfifo("/usr/bin/nvidia-x" + {FORGED!r} + "\\x1b[2J\\x1b]0;owned\\x07")
"""


def _forged(line: str) -> bool:
    """A line of its own that is the jail's event, as JSON or as text."""
    if line.strip().startswith('{"event": "install_ok", "message": "FORGED'):
        return True
    try:
        doc = json.loads(line)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("message") == "FORGED: installed"


def test_a_name_the_jail_chose_is_one_escaped_line_everywhere(ubuntu, tmp_path):
    """H1: the FIFO is refused by name; the name's newlines and escapes are shown as
    ``\\n`` and ``\\x1b`` in the final message, status.json and ``status`` output."""
    run = doctored_run(tmp_path / "run", files={".fifo.py": FIFO_MAKER},
                       installer=f'{RUN_REAL}\npython3 "$(dirname "$0")/.fifo.py"')
    ubuntu.server.serve_run(V, run)
    proc = ubuntu.run("install")
    last = outcome(proc, 7, "is a FIFO", "nothing was installed")
    assert "\\n{" in last["message"] and "\\x1b[2J" in last["message"], last["message"]
    assert "\x1b" not in proc.stderr + proc.stdout
    status = ubuntu.run("status")
    shown = status.stdout + status.stderr
    assert "\\x1b" in shown or "\\\\x1b" in shown, shown[-2000:]
    assert "\x1b" not in shown and "\x07" not in shown
    assert not [line for line in shown.splitlines() if _forged(line)], shown[-2000:]
    ubuntu.assert_host_unchanged()


SETUID = """chmod 4755 /usr/bin/nvidia-smi
chmod 0666 /usr/lib/x86_64-linux-gnu/libcuda.so.*
touch /usr/bin/ndi-6777 && chmod 6777 /usr/bin/ndi-6777
mkdir -p /usr/lib/x86_64-linux-gnu/ndi-dir && chmod 1777 /usr/lib/x86_64-linux-gnu/ndi-dir"""


def test_the_harvest_writes_modes_it_chose(ubuntu, tmp_path):
    """H2: the install succeeds with the jail's files at 0755/0644 and its dirs 0755: no
    setuid, setgid, sticky or group/world-writable entry anywhere in the install dir."""
    run = doctored_run(tmp_path / "run", installer=f"{RUN_REAL}\n{SETUID}")
    ubuntu.server.serve_run(V, run)
    proc = ubuntu.run("install")
    outcome(proc, 0)
    root = ubuntu.node.install_dir
    bad = {str(p.relative_to(root)): oct(p.lstat().st_mode & 0o7777)
           for p in root.rglob("*") if not p.is_symlink()
           and p.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | 0o022)}
    assert bad == {}
    assert stat.S_IMODE((root / "bin/nvidia-smi").lstat().st_mode) == 0o755
    assert stat.S_IMODE((root / "bin/ndi-6777").lstat().st_mode) == 0o755
    libcuda = [p for p in (root / "lib64").glob("libcuda.so.*") if not p.is_symlink()]
    assert libcuda and {stat.S_IMODE(p.lstat().st_mode) for p in libcuda} == {0o644}
    ubuntu.assert_host_unchanged(installed=True)
