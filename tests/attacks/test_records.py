"""Hostile records (issue 22, items 3-5): JSON nested 100000 deep where a bundle index, a
bundle manifest, status.json or the COS tools marker belongs; .cache and status.json of the
wrong type (a symlink loop, a directory); .cache hash entries that name files outside the
install, through links, or a file far larger than any driver file.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest

from tests.attacks.conftest import TOOLS, event_names, outcome
from tests.pod import events

pytestmark = pytest.mark.chroot

DEEP = "[" * 100_000  # json.loads: RecursionError, not ValueError


# -- item 3: deeply nested JSON -----------------------------------------------------------------


def test_deeply_nested_bundle_index_is_exit_6(ubuntu):
    bundles = ubuntu.node.path("/srv/bundles")
    bundles.mkdir(parents=True)
    (bundles / "index.json").write_text(DEEP)
    ubuntu.snapshot()
    proc = ubuntu.run("install", "--prebuilt-url", "file:///root/srv/bundles/")
    outcome(proc, 6, "bundle index", "unusable", "nested")
    ubuntu.assert_host_unchanged()


def test_deeply_nested_bundle_manifest_is_exit_6(ubuntu):
    bundle = ubuntu.node.path("/srv/bundles/b.tar.gz")
    bundle.parent.mkdir(parents=True)
    with tarfile.open(bundle, "w:gz") as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(DEEP)
        tar.addfile(info, io.BytesIO(DEEP.encode()))
    digest = hashlib.sha256(bundle.read_bytes()).hexdigest()
    ubuntu.snapshot()
    proc = ubuntu.run("install", "--prebuilt-url", "file:///root/srv/bundles/b.tar.gz",
                      "--prebuilt-sha256", digest)
    outcome(proc, 6, "bad manifest", "nested")
    ubuntu.assert_host_unchanged()


def test_deeply_nested_status_json_is_a_clear_error(ubuntu):
    outcome(ubuntu.run("install"), 0)
    (ubuntu.node.install_dir / "status.json").write_text(DEEP)
    ubuntu.snapshot()
    outcome(ubuntu.run("status", "-o", "json"), 6, "corrupt status file", "nested")
    ubuntu.assert_host_unchanged()


def test_deeply_nested_cos_tools_marker_is_an_incomplete_tree(cos):
    outcome(cos.run("install"), 0)
    marker, = cos.node.path("/" + TOOLS).glob("*/kernel-headers/.nvidia-driver-installer.json")
    marker.write_text(DEEP[:60_000])  # the marker is read only up to 64 KiB
    (cos.node.install_dir / ".cache").unlink()
    cos.snapshot()
    proc = cos.run("install")
    outcome(proc, 0, "installed and verified")  # the tree is re-extracted
    assert json.loads(marker.read_text())["files"] > 0


# -- item 4: records of the wrong type ----------------------------------------------------------


def _loop(path) -> None:
    path.unlink()
    os.symlink(path.name, path)  # ELOOP


# doctor: exit 9, its cache check failed (no usable record), not 1 with a traceback.
@pytest.mark.parametrize("command, code", [("install", 0), ("status", 0), ("doctor", 9)])
def test_cache_record_as_a_symlink_loop_is_no_record(ubuntu, command, code):
    outcome(ubuntu.run("install"), 0)
    _loop(ubuntu.node.install_dir / ".cache")
    ubuntu.snapshot()
    # JSON log lines: install's in the pod, a report's with -o json (they follow -o)
    proc = ubuntu.run(command, *(() if command == "install" else ("-o", "json")))
    outcome(proc, code)
    assert "cache_record_unusable" in event_names(proc)
    if command == "install":
        assert (ubuntu.node.install_dir / ".cache").is_file()
        assert not (ubuntu.node.install_dir / ".cache").is_symlink()
        ubuntu.assert_host_unchanged(installed=True)
    else:
        ubuntu.assert_host_unchanged()


def _installed_with_a_directory_as(ubuntu, record: str):
    """A good install whose ``record`` was then replaced by a non-empty directory."""
    outcome(ubuntu.run("install"), 0)
    path = ubuntu.node.install_dir / record
    path.unlink()
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "f").write_text("in the way\n")
    ubuntu.snapshot()
    return path


@pytest.mark.parametrize("record", [".cache", "status.json"])
def test_record_as_a_directory_is_replaced_by_the_next_install(ubuntu, record):
    path = _installed_with_a_directory_as(ubuntu, record)
    proc = ubuntu.run("install")
    outcome(proc, 0, "verified")  # .cache: a fresh install; status.json: a cache hit
    assert path.is_file() and not path.is_symlink()
    ubuntu.assert_host_unchanged(installed=True)
    assert ubuntu.run("status").returncode == 0


@pytest.mark.parametrize("record", [".cache", "status.json"])
def test_record_as_a_directory_does_not_stop_uninstall(ubuntu, record):
    _installed_with_a_directory_as(ubuntu, record)
    proc = ubuntu.run("uninstall")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (ubuntu.node.install_dir / ".cache").exists()
    assert (ubuntu.node.install_dir / "status.json").is_file()


# -- item 5: .cache hash entries that name any path ---------------------------------------------


def _add_hash_entry(world, entry: str, content: bytes) -> None:
    """Put ``entry`` (with the sha256 of ``content``) first in the record's hash list."""
    cache = world.node.install_dir / ".cache"
    digest = hashlib.sha256(content).hexdigest()
    text = cache.read_text().replace("CACHE_FILE_SHA256='", f"CACHE_FILE_SHA256='{entry}:{digest} ")
    cache.write_text(text)


@pytest.mark.parametrize("case, words", [
    ("absolute", "not a clean relative path"),
    ("dotdot", "not a clean relative path"),
    ("outside_layout", "is not inside bin, lib64, drivers, firmware"),
    ("symlinked_dir", "symlink"),
    ("symlinked_file", "symlink"),
    ("huge", "more than any driver file"),
])
def test_cache_hash_entries_outside_the_install_are_a_miss(ubuntu, case, words):
    outcome(ubuntu.run("install"), 0)
    content = b"gpu-node-1\n"
    ubuntu.node.path("/etc/hostname").write_text(content.decode())
    drivers = ubuntu.node.install_dir / "drivers"
    if case == "absolute":  # the pod's view of the host's /etc/hostname
        entry = "/root/etc/hostname"
    elif case == "dotdot":
        entry = "lib64/" + "../" * 8 + "root/etc/hostname"
    elif case == "outside_layout":
        (ubuntu.node.install_dir / "notes").write_bytes(content)
        entry = "notes"
    elif case == "symlinked_dir":
        os.symlink("/root/etc", drivers / "sub")
        entry = "drivers/sub/hostname"
    elif case == "symlinked_file":
        os.symlink("/root/etc/hostname", drivers / "x.ko")
        entry = "drivers/x.ko"
    else:
        with open(drivers / "big.ko", "wb") as f:
            f.truncate(2 << 30)  # sparse; hashing it costs seconds, a 1 TiB one an hour
        entry = "drivers/big.ko"
    _add_hash_entry(ubuntu, entry, content)
    ubuntu.snapshot()
    proc = ubuntu.run("install", timeout=120)
    outcome(proc, 0, "installed and verified")
    misses = [e for e in events(proc.stderr) if e.get("event") == "cache_miss"]
    assert misses and words in misses[0]["reason"] and entry[:20] in misses[0]["reason"], misses
    ubuntu.assert_host_unchanged(installed=True)
