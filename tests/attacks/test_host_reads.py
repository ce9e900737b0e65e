"""Host files that are not what they should be: FIFOs, devices and huge files where small
config files belong, shell code in the cache record, a BUILD_ID that climbs.
"""

from __future__ import annotations

import os
import stat

import pytest

from tests.attacks.conftest import event_names, outcome

pytestmark = pytest.mark.chroot


# -- case 11: host files read without limits --------------------------------------------------


def _plant(path, kind: str) -> str:
    """Replace ``path`` by a hostile ``kind``; returns the words the refusal must use."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
        return "is a FIFO"
    if kind == "device":
        os.mknod(path, stat.S_IFCHR | 0o644, os.makedev(1, 5))  # /dev/zero: endless
        return "character device"
    if kind == "huge":
        with open(path, "wb") as f:
            f.truncate(400 << 20)  # sparse: no disk used
        return "more than"
    path.write_text('ID=ubuntu\nPRETTY_NAME="' + "x" * (40 << 20) + '"\n')  # shlex: hours
    return "more than"


@pytest.mark.parametrize("kind", ["fifo", "device", "huge", "long_value"])
def test_hostile_os_release_is_a_clear_exit_3(ubuntu, kind):
    words = _plant(ubuntu.node.path("/etc/os-release"), kind)
    ubuntu.snapshot()
    proc = ubuntu.run("install", timeout=60)
    outcome(proc, 3, "/etc/os-release", words)
    ubuntu.assert_host_unchanged()


def test_a_fifo_as_the_cache_record_does_not_hang_the_locked_run(ubuntu):
    outcome(ubuntu.run("install"), 0)
    _plant(ubuntu.node.install_dir / ".cache", "fifo")
    ubuntu.snapshot()
    proc = ubuntu.run("install", timeout=60)
    outcome(proc, 0, "installed and verified")  # treated as no record: a fresh install
    assert "cache_record_unusable" in event_names(proc)
    assert (ubuntu.node.install_dir / ".cache").is_file()
    ubuntu.assert_host_unchanged(installed=True)


def test_a_fifo_as_status_json_is_a_clear_error(ubuntu):
    outcome(ubuntu.run("install"), 0)
    _plant(ubuntu.node.install_dir / "status.json", "fifo")
    ubuntu.snapshot()
    proc = ubuntu.run("status", "-o", "json", timeout=60)
    outcome(proc, 6, "status.json is a FIFO")
    ubuntu.assert_host_unchanged()


# -- already held -------------------------------------------------------------------------------


def test_shell_code_in_the_cache_record_is_never_run(ubuntu):
    outcome(ubuntu.run("install"), 0)
    pwned = ubuntu.canary / "pwned"
    (ubuntu.node.install_dir / ".cache").write_text(
        f'CACHE_NVIDIA_DRIVER_VERSION="$(touch {pwned})"\n'
        f"CACHE_KERNEL_VERSION=`touch {pwned}`; touch {pwned}\n"
        f"CACHE_FILE_SHA256='drivers/nvidia.ko:$(touch {pwned})'\n")
    ubuntu.snapshot()
    proc = ubuntu.run("install")
    outcome(proc, 0, "installed and verified")
    assert not pwned.exists()
    ubuntu.assert_host_unchanged(installed=True)


def test_a_build_id_that_climbs_is_refused(cos):
    os_release = cos.node.path("/etc/os-release")
    os_release.write_text(os_release.read_text().replace("BUILD_ID=17801.218.41",
                                                         "BUILD_ID=../../../etc"))
    cos.snapshot()
    proc = cos.run("install")
    outcome(proc, 3, "malformed BUILD_ID")
    cos.assert_host_unchanged()
