"""Host files that are not what they should be: FIFOs, devices and huge files where small
config files belong, shell code in the cache record, a BUILD_ID that climbs.
"""

from __future__ import annotations

import os
import stat

import pytest

from tests.attacks.conftest import V, event_names, outcome

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


# -- issue 33 item 9: a local file named as the driver ------------------------------------------


def test_a_local_file_named_as_the_driver_is_never_shown(ubuntu):
    """``--driver-url file:///etc/shadow``: refused as not a .run (exit 6) without a byte
    of it in the message, the log or status.json. On abf8713 its first 40 characters were
    in all three."""
    secret = "host-secret-9b2e47:$y$j9T$notreal"
    ubuntu.node.path("/etc/ndi-shadow").write_text(f"{secret}\n")
    proc = ubuntu.run("install", "--driver-version", V,
                      "--driver-url", "file:///root/etc/ndi-shadow",
                      env={"NVIDIA_DRIVER_BASE_URL": ""})
    assert "host-secret" not in proc.stderr + proc.stdout
    leaked = [str(p) for p in ubuntu.node.install_dir.rglob("*")
              if p.is_file() and "host-secret" in p.read_text(errors="replace")]
    assert leaked == []
    outcome(proc, 6, "ndi-shadow is not an NVIDIA installer", "local file")
