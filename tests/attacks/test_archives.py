"""Hostile archives from the COS bucket: privileges smuggled in xattrs, header bombs, members
that escape, and a disk that fills up while extracting.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from tests.attacks.conftest import V_OLD, outcome
from tests.cosbucket import EVIL_PATHS, toolchain_txz

pytestmark = pytest.mark.chroot

PREBUILT = f"nvidia-drivers-{V_OLD}.tgz"
CAP_SETUID_EP = "\x01\x00\x00\x02\x80\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"


def _rewrite(tgz: Path, extra: list[tuple[tarfile.TarInfo, bytes | None]],
             edit=None) -> None:
    """Rewrite ``tgz`` (PAX) with every member (``edit(info)`` may change each) plus ``extra``."""
    with tarfile.open(tgz) as src:
        members = [(m, src.extractfile(m).read() if m.isreg() else None) for m in src]
    with tarfile.open(tgz, "w:gz", format=tarfile.PAX_FORMAT) as out:
        for info, data in members + extra:
            if edit is not None:
                edit(info)
            out.addfile(info, io.BytesIO(data) if data is not None else None)


def _file(name: str, data: bytes, mode: int = 0o644, **pax: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.pax_headers = len(data), mode, 1_700_000_000, pax
    return info, data


def _cos_prebuilt(cos) -> Path:
    cos.bucket.prebuilt_versions = (V_OLD,)
    return cos.bucket.write() / PREBUILT


def _xattrs(path: Path) -> dict[str, bytes]:
    return {n: os.getxattr(path, n, follow_symlinks=False)
            for n in os.listxattr(path, follow_symlinks=False)}


# -- case 1: file capabilities (and other xattrs) from an archive --------------------------


def test_file_capabilities_in_prebuilt_modules_are_never_applied(cos):
    tgz = _cos_prebuilt(cos)

    def sign_firmware(info: tarfile.TarInfo) -> None:
        if info.name.endswith(".bin"):
            info.pax_headers = {"SCHILY.xattr.security.ima": "\x03\x02ima-signature"}

    _rewrite(tgz, [_file(f"firmware/nvidia/{V_OLD}/helper", b"#!/bin/sh\nid\n", 0o755, **{
        "SCHILY.xattr.security.capability": CAP_SETUID_EP,
        "SCHILY.xattr.trusted.overlay.opaque": "y", "SCHILY.xattr.user.note": "x"})],
        edit=sign_firmware)
    proc = cos.run("install")
    outcome(proc, 0, "installed and verified")
    install = cos.node.install_dir
    helper = install / f"firmware/nvidia/{V_OLD}/helper"
    assert helper.is_file() and _xattrs(helper) == {}
    assert _xattrs(install / f"firmware/nvidia/{V_OLD}/gsp_ga10x.bin") == {
        "security.ima": b"\x03\x02ima-signature"}  # the one xattr COS firmware needs
    for dirpath, _dirs, files in os.walk(install):
        for name in files:
            assert "security.capability" not in _xattrs(Path(dirpath) / name), name
    cos.assert_host_unchanged(installed=True)


# -- case 9: the disk fills up while extracting --------------------------------------------


@pytest.mark.parametrize("artifact", ["prebuilt", "toolchain"])
def test_disk_full_while_extracting_is_exit_11_and_leaves_no_staging(cos, tmp_path, artifact):
    zeros = _file("filler.bin", b"\0" * (8 << 20))  # 8 MB that compress to a few KB
    env = {}
    if artifact == "prebuilt":
        _rewrite(_cos_prebuilt(cos), [zeros])
    else:
        toolchain = cos.bucket.write() / "toolchain.tar.xz"
        toolchain_txz(toolchain)
        _rewrite(toolchain, [zeros])
        env["COS_TOOLS_DIR_CONTAINER"] = "/usr/local/nvidia/tools"  # on the small tmpfs
    out = tmp_path / "install-after"
    proc = cos.run("install", env=env, install_dir_tmpfs="2m", export_install_dir=out)
    outcome(proc, 11, "disk filled up", "free")
    assert not (out / ".staging").exists()
    assert not (out / ".cache").exists()
    assert [p for p in out.rglob("*.extracting")] == []
    cos.assert_host_unchanged()


# -- case 10: header bombs and limits ---------------------------------------------------------


def test_tar_header_bomb_is_refused_before_it_is_read(cos):
    """A GNU long-name header claiming 6 GiB in a small gzip: read whole, it is an OOM kill."""
    tgz = _cos_prebuilt(cos)
    header = tarfile.TarInfo("././@LongLink")
    header.type, header.size = tarfile.GNUTYPE_LONGNAME, 6 << 30
    with gzip.open(tgz, "wb") as f:
        f.write(header.tobuf(format=tarfile.USTAR_FORMAT))
        f.write(b"n" * (1 << 20))  # the start of the name; gzip shrinks it to a few KB
    proc = cos.run("install")
    outcome(proc, 6, "unsafe archive", "extended header")
    cos.assert_host_unchanged()


def test_member_path_too_long_is_integrity_not_a_crash(cos):
    tgz = _cos_prebuilt(cos)
    _rewrite(tgz, [_file("drivers/" + "x" * 300 + ".ko", b"x")])
    proc = cos.run("install")
    outcome(proc, 6, "unsafe archive", "path too long")
    cos.assert_host_unchanged()


# -- already held: unsafe members -------------------------------------------------------------


@pytest.mark.parametrize("evil", ["dotdot", "absolute", "symlink_out", "hardlink_out", "device"])
def test_unsafe_members_of_kernel_headers_are_refused(cos, evil):
    cos.bucket.evil_headers = evil
    proc = cos.run("install")
    outcome(proc, 6, "unsafe archive", "nothing was extracted")
    for path in EVIL_PATHS:
        assert not cos.node.path(path).exists()
    cos.assert_host_unchanged()


def test_link_chain_retargeted_by_a_later_member_is_refused(cos):
    """Each link resolves inside when it is made; together they point out of the tree."""
    headers = cos.bucket.write() / "kernel-headers.tgz"

    def link(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = tarfile.SYMTYPE, target
        return info, None

    _rewrite(headers, [link("l", "d/.."), link("d", "."), _file("l/escaped", b"evil")])
    proc = cos.run("install")
    outcome(proc, 6, "unsafe archive", "outside")
    cos.assert_host_unchanged()


# -- issue 22 item 6: archive depth -----------------------------------------------------------


def _deep(depth: int, leaf: str = "f") -> str:
    return "usr/src/" + "d/" * (depth - 2) + leaf


def test_a_member_1000_directories_deep_is_refused(cos):
    headers = cos.bucket.write() / "kernel-headers.tgz"
    _rewrite(headers, [_file(_deep(1000), b"x")])
    proc = cos.run("install")
    outcome(proc, 6, "unsafe archive", "directories deep")
    cos.assert_host_unchanged()


def test_many_deep_members_are_refused_at_once(cos):
    """800 members 800 deep, a 9.4 KB tgz: ~76 ms each resolving their parents (60 s)."""
    headers = cos.bucket.write() / "kernel-headers.tgz"
    _rewrite(headers, [_file(_deep(800, f"f{i}"), b"x") for i in range(800)])
    proc = cos.run("install", timeout=20)
    outcome(proc, 6, "unsafe archive", "directories deep")
    cos.assert_host_unchanged()
