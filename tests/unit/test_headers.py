"""Kernel header trees: Debian/Ubuntu's split source and output dirs are both found."""

from __future__ import annotations

import os
from pathlib import Path

from installer.host.hostroot import HostRoot
from installer.kmod import headers

RELEASE = "6.1.0-56-amd64"
COMMON = "/usr/src/linux-headers-6.1.0-56-common"
OUTPUT = f"/usr/src/linux-headers-{RELEASE}"


def _debian_headers(root: Path) -> None:
    """The layout of linux-headers-<r> + linux-headers-<X>-common, links absolute."""
    (root / COMMON.lstrip("/")).mkdir(parents=True)
    (root / COMMON.lstrip("/") / "Makefile").write_text("VERSION = 6\nPATCHLEVEL = 1\n")
    out = root / OUTPUT.lstrip("/")
    out.mkdir(parents=True)
    # Exactly what Debian's linux-headers-6.1.0-56-amd64 ships as its Makefile.
    (out / "Makefile").write_text(f"include {COMMON}/Makefile\n")
    mods = root / "lib/modules" / RELEASE
    mods.mkdir(parents=True)
    os.symlink(OUTPUT, mods / "build")
    os.symlink(COMMON, mods / "source")


def test_split_headers_give_source_and_output_inside_the_host_root(tmp_path):
    _debian_headers(tmp_path)
    tree, tried = headers.find_on_host(HostRoot(tmp_path), RELEASE, None)
    assert tried == []
    assert tree.source == tmp_path / COMMON.lstrip("/")
    assert tree.output == tmp_path / OUTPUT.lstrip("/")


def test_build_link_alone_is_followed_with_chroot_semantics(tmp_path):
    _debian_headers(tmp_path)
    # Only /lib/modules/<r>/build: the /usr/src/linux-headers-<r> candidate is absent.
    os.rename(tmp_path / OUTPUT.lstrip("/"), tmp_path / "usr/src/arch-dir")
    build = tmp_path / "lib/modules" / RELEASE / "build"
    build.unlink()
    os.symlink("/usr/src/arch-dir", build)
    tree, _ = headers.find_on_host(HostRoot(tmp_path), RELEASE, None)
    assert tree.output == tmp_path / "usr/src/arch-dir"
    assert tree.source == tmp_path / COMMON.lstrip("/")


def test_a_full_kernel_tree_is_both(tmp_path):
    full = tmp_path / OUTPUT.lstrip("/")
    full.mkdir(parents=True)
    (full / "Makefile").write_text(
        "VERSION = 5\nPATCHLEVEL = 15\ninclude $(srctree)/scripts/Kbuild.include\n")
    tree, _ = headers.find_on_host(HostRoot(tmp_path), RELEASE, None)
    assert tree.source == tree.output == full
    assert tree.describe() == str(full)


def test_an_include_naming_no_tree_keeps_the_dir_for_both(tmp_path):
    _debian_headers(tmp_path)
    (tmp_path / COMMON.lstrip("/") / "Makefile").unlink()
    tree, _ = headers.find_on_host(HostRoot(tmp_path), RELEASE, None)
    assert tree.source == tree.output == tmp_path / OUTPUT.lstrip("/")


def test_explicit_output_dir_finds_its_source(tmp_path):
    _debian_headers(tmp_path)
    explicit = tmp_path / OUTPUT.lstrip("/")
    tree, _ = headers.find_on_host(HostRoot(tmp_path), RELEASE, explicit)
    assert (tree.source, tree.output) == (tmp_path / COMMON.lstrip("/"), explicit)
    assert "output" in tree.describe()


def test_missing_headers_say_what_was_tried(tmp_path):
    tree, tried = headers.find_on_host(HostRoot(tmp_path), RELEASE, None)
    assert tree is None
    assert tried == [f"host /usr/src/linux-headers-{RELEASE}", f"host /lib/modules/{RELEASE}/build"]
