"""v2's -prepare-build-tools layout (cos/tools src/pkg/cos/cos.go L21-22, L72-113)."""

from __future__ import annotations

from installer.distros.cos.toolchain import BuildTools
from installer.distros.cos.v2_tools import V2BuildTools, adopt

CC, REL, BUILD = "x86_64-cros-linux-gnu-clang", "6.1.85+", "18244.151.14"


def _v2_layout(tools, release=REL):
    (tools / "bin").mkdir(parents=True)
    (tools / "bin" / CC).write_text("#!/bin/sh\n")
    tree = tools / f"usr/src/linux-headers-{release}"
    tree.mkdir(parents=True)
    (tree / "Makefile").write_text("# kernel\n")


def test_v2_layout_is_adopted_when_ours_is_missing(tmp_path):
    _v2_layout(tmp_path)
    got = adopt(BuildTools(tmp_path, BUILD), REL, CC, pinned=False)
    assert isinstance(got, V2BuildTools)
    assert got.toolchain == got.headers == got.root == tmp_path


def test_not_adopted_for_another_kernel_a_missing_compiler_or_pins(tmp_path):
    _v2_layout(tmp_path, release="6.1.58+")
    assert type(adopt(BuildTools(tmp_path, BUILD), REL, CC, pinned=False)) is BuildTools
    (tmp_path / f"usr/src/linux-headers-{REL}").mkdir()
    (tmp_path / f"usr/src/linux-headers-{REL}/Makefile").write_text("")
    assert isinstance(adopt(BuildTools(tmp_path, BUILD), REL, CC, pinned=False), V2BuildTools)
    assert type(adopt(BuildTools(tmp_path, BUILD), REL, "other-cc", pinned=False)) is BuildTools
    assert type(adopt(BuildTools(tmp_path, BUILD), REL, CC, pinned=True)) is BuildTools
