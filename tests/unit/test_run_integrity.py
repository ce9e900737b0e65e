"""A download that is not an NVIDIA .run is an integrity failure (exit 6), told safely.

The header facts are those of NVIDIA's makeself (1.6.0-nv2, shipped as makeself.sh inside
the .run: "#! /bin/sh", CRCsum=, MD5=, skip=, label=) and of stock makeself 2.x (the fixture
.run): the payload starts after `skip` lines.
"""

from __future__ import annotations

import pytest

from installer.base.errors import ExitCode, IntegrityError
from installer.driver.nvidia_run import _CORRUPT, check_run_file, preview
from tests.fixtures.runfile import build_driver_run

NAME = "NVIDIA-Linux-x86_64-550.54.14.run"
HINT = ("the server sent something else (a proxy's HTML page, an error, a cut-off download): "
        "check --driver-url and the proxy, then re-run")
NVIDIA_HEADER = (b'#! /bin/sh\nCRCsum=1234567890\nMD5=0123456789abcdef0123456789abcdef\nskip=4\n'
                 b'label="NVIDIA Accelerated Graphics Driver for Linux-x86_64 550.54.14"\n')


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    return build_driver_run(tmp_path_factory.mktemp("run")).read_bytes()


def _refused(tmp_path, data: bytes, *, from_network: bool = True) -> IntegrityError:
    path = tmp_path / NAME
    path.write_bytes(data)
    with pytest.raises(IntegrityError) as info:
        check_run_file(path, from_network=from_network)
    assert info.value.exit_code == ExitCode.INTEGRITY == 6
    assert info.value.hint == HINT
    assert info.value.context["path"] == str(path)
    return info.value


def test_a_makeself_run_passes(tmp_path, good_run):
    (tmp_path / NAME).write_bytes(good_run)
    check_run_file(tmp_path / NAME)


def test_nvidias_own_makeself_header_passes(tmp_path):
    (tmp_path / NAME).write_bytes(NVIDIA_HEADER + b"\xfd7zXZ\x00 payload")
    check_run_file(tmp_path / NAME)


def test_an_html_page_from_a_proxy_is_not_an_nvidia_installer(tmp_path):
    page = b"<!DOCTYPE html>\n<html><head><title>Access denied</title></head><body>" + b"x" * 500
    err = _refused(tmp_path, page)
    assert err.message == (f"{NAME} is not an NVIDIA installer (starts with: "
                           "'<!DOCTYPE html> <html><head><title>Acces…')")


def test_random_bytes_are_shown_printable_and_short(tmp_path):
    err = _refused(tmp_path, bytes(range(256)) * 4)
    shown = err.message.split("starts with: '", 1)[1]
    # Control bytes are dots, tab/newline/CR blanks: 40 characters, then the ellipsis.
    assert shown == "." * 9 + "  .. " + "." * 18 + " !\"#$%&'…')"
    assert all(c.isprintable() for c in err.message)


@pytest.mark.parametrize("cut", [3000, 15000])
def test_a_run_cut_inside_its_header_is_refused(tmp_path, good_run, cut):
    err = _refused(tmp_path, good_run[:cut])
    assert err.message.startswith(f"{NAME} is not an NVIDIA installer (its makeself header is "
                                  "cut off after ")
    assert err.message.endswith(" of 720 lines)")


def test_a_run_cut_before_its_header_variables_shows_how_it_starts(tmp_path, good_run):
    err = _refused(tmp_path, good_run[:500])
    assert err.message == (f"{NAME} is not an NVIDIA installer (starts with: "
                           "'#!/bin/sh # This script was generated us…')")


def test_an_empty_file_is_refused(tmp_path):
    assert _refused(tmp_path, b"").message == f"{NAME} is not an NVIDIA installer (the file is empty)"


def test_preview_keeps_short_text_whole():
    assert preview(b"#!/bin/sh\n") == "#!/bin/sh "


@pytest.mark.parametrize(("output", "corrupt"), [
    ("Verifying archive integrity... Error in check sums 123 456", True),  # NVIDIA's makeself
    ("Verifying archive integrity... Error in md5 sums abc def", True),
    ("Error in checksums: 1 is different from 2", True),  # makeself 2.x
    ("Error in SHA256 checksums: a is different from b", True),
    ("Verifying archive integrity... Unexpected archive size.", True),
    ("Verifying archive integrity... OK\nUncompressing NVIDIA … xz: command not found", False),
])
def test_makeselfs_own_check_failures_are_corruption_and_nothing_else(output, corrupt):
    assert bool(_CORRUPT.search(output)) is corrupt


def test_a_local_file_is_never_shown(tmp_path):
    """A file:// .run that is not one (``file:///etc/shadow``): named, its bytes not shown."""
    err = _refused(tmp_path, b"root:$y$j9T$secret:19000:0:99999:7:::\n", from_network=False)
    assert "secret" not in err.message and "root:" not in err.message
    assert "a local file without a makeself header" in err.message
