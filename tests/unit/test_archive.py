"""installer.jail.archive: safe extraction of archives we did not make."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from installer.base.errors import ExitCode, IntegrityError
from installer.jail import archive, tarstream

# --------------------------------------------------------------------------- helpers


def _info(name: str, kind: bytes = tarfile.REGTYPE, **kw) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for k, v in kw.items():
        setattr(info, k, v)
    return info


def make_tar(path: Path, members: list, mode: str = "w:gz", pax: bool = False) -> Path:
    """members: (name, bytes) files, or TarInfo objects (links, dirs, devices)."""
    fmt = tarfile.PAX_FORMAT if pax else tarfile.GNU_FORMAT
    with tarfile.open(path, mode, format=fmt) as tar:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tar.addfile(m)
            else:
                name, data = m[0], m[1]
                info = _info(name, size=len(data), mode=m[2] if len(m) > 2 else 0o644)
                tar.addfile(info, io.BytesIO(data))
    return path


def snapshot(root: Path) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            out.add(str((Path(dirpath) / n).relative_to(root)))
    return out


@pytest.fixture
def area(tmp_path):
    """A sandbox: the archive and target live in area/work; area/outside is what must
    stay untouched (links in the archives aim at it)."""
    (tmp_path / "work").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/secret").write_text("keep me")
    return tmp_path


def refused(area: Path, members: list, match: str, **kw) -> IntegrityError:
    tgz = make_tar(area / "work/evil.tgz", members)
    before = snapshot(area)
    target = area / "work/target"
    with pytest.raises(IntegrityError, match=match) as err:
        archive.extract(tgz, target, **kw)
    assert err.value.exit_code == ExitCode.INTEGRITY == 6
    assert not target.exists()
    assert not (area / "work/.target.extracting").exists()
    assert snapshot(area) == before, "something was written"
    assert (area / "outside/secret").read_text() == "keep me"
    return err.value


# --------------------------------------------------------------------------- refusals


def test_dotdot_member_is_refused(area):
    err = refused(area, [("ok.txt", b"fine"), ("../outside/x", b"evil")], r"'\.\.' path component")
    assert err.context["member"] == "../outside/x"
    assert err.context["path"].endswith("evil.tgz")


def test_nested_dotdot_is_refused(area):
    refused(area, [("a/b/../../../outside/x", b"evil")], r"'\.\.'")


def test_absolute_member_is_refused(area):
    abs_target = str(area / "outside/abs")
    refused(area, [(abs_target, b"evil")], "absolute path")
    assert not Path(abs_target).exists()


def test_symlink_pointing_out_is_refused(area):
    refused(area, [_info("escape", tarfile.SYMTYPE, linkname="../../outside")],
            "symlink pointing outside")


def test_absolute_symlink_is_refused(area):
    refused(area, [_info("etc", tarfile.SYMTYPE, linkname="/etc")], "absolute path '/etc'")


def test_write_through_symlink_is_refused(area):
    # The link alone is refused; the file under it would land outside.
    refused(area, [_info("l", tarfile.SYMTYPE, linkname="../../outside"), ("l/secret", b"evil")],
            "outside")


def test_hardlink_pointing_out_is_refused(area):
    refused(area, [_info("h", tarfile.LNKTYPE, linkname="../outside/secret")], r"hard link")


def test_absolute_hardlink_is_refused(area):
    refused(area, [_info("h", tarfile.LNKTYPE, linkname=str(area / "outside/secret"))],
            "hard link")


def test_hardlink_to_missing_member_is_refused(area):
    refused(area, [_info("h", tarfile.LNKTYPE, linkname="nothere")], "not extracted before")


def test_character_device_is_refused(area):
    refused(area, [("ok", b"x"), _info("dev/null", tarfile.CHRTYPE, devmajor=1, devminor=3)],
            "device file")


def test_block_device_is_refused(area):
    refused(area, [_info("sda", tarfile.BLKTYPE, devmajor=8, devminor=0)], "device file")


def test_fifo_is_refused(area):
    refused(area, [_info("pipe", tarfile.FIFOTYPE)], "FIFO")


def test_link_chain_that_escapes_later_is_refused(area):
    # Each link resolves inside when it is created; together they point out:
    # l -> d/.. is the root while d does not exist; then d -> . makes l the root's parent.
    refused(area, [
        _info("sub", tarfile.DIRTYPE, mode=0o755),
        _info("l", tarfile.SYMTYPE, linkname="d/.."),
        _info("d", tarfile.SYMTYPE, linkname="."),
        ("l/escaped", b"evil"),
    ], "outside")


def test_link_chain_left_dangling_out_is_refused(area):
    # Same chain without a file written through it: the final check catches the link.
    refused(area, [
        _info("l", tarfile.SYMTYPE, linkname="d/.."),
        _info("d", tarfile.SYMTYPE, linkname="."),
    ], "symlink pointing outside")


def test_file_replacing_directory_is_refused(area):
    refused(area, [_info("d", tarfile.DIRTYPE, mode=0o755), ("d", b"x")],
            "replacing a directory")


def test_size_limit(area):
    refused(area, [("big", b"x" * 100)], "more than 10 bytes", max_bytes=10)


def test_corrupt_archive_is_integrity_error(area):
    good = make_tar(area / "work/good.tgz", [("f", os.urandom(200_000))])
    data = good.read_bytes()
    bad = area / "work/bad.tgz"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(IntegrityError, match="corrupt archive"):
        archive.extract(bad, area / "work/target")
    assert not (area / "work/target").exists()
    junk = area / "work/junk.tgz"
    junk.write_bytes(b"this is not a tarball at all" * 10)
    with pytest.raises(IntegrityError, match="corrupt archive"):
        archive.extract(junk, area / "work/target")


@pytest.mark.parametrize("damage", ["checksum", "cut"])
def test_a_damaged_zstd_stream_is_a_corrupt_archive(area, damage):
    """zstd's own error (the binding loads only for a zstd archive) is a corrupt archive
    like gzip's and xz's: a bad frame checksum, a frame cut short."""
    import zstandard

    tar = make_tar(area / "work/a.tar", [("a", os.urandom(100_000))], mode="w").read_bytes()
    good = zstandard.ZstdCompressor(write_checksum=True).compress(tar)
    bad = (good[:-4] + bytes(b ^ 0xFF for b in good[-4:]) if damage == "checksum"
           else good[: len(good) * 3 // 4])
    for source in (io.BytesIO(bad), area / "work/bad.zst"):
        (area / "work/bad.zst").write_bytes(bad)
        with pytest.raises(IntegrityError, match="corrupt archive"):
            archive.extract(source, area / "work/t")
        assert not (area / "work/t").exists()


def test_target_must_not_exist(area):
    tgz = make_tar(area / "work/a.tgz", [("f", b"x")])
    (area / "work/target").mkdir()
    with pytest.raises(FileExistsError):
        archive.extract(tgz, area / "work/target")


# --------------------------------------------------------------------------- what works


def test_normal_tree_with_internal_links(area):
    tgz = make_tar(area / "work/ok.tar.xz", [
        _info("./usr", tarfile.DIRTYPE, mode=0o755),
        ("./usr/src/linux-headers-6.1.85+/Makefile", b"VERSION = 6\n"),
        ("./usr/bin/tool", b"#!/bin/sh\n", 0o4755),
        _info("./usr/bin/alias", tarfile.SYMTYPE, linkname="tool"),
        _info("./usr/lib/dir-link", tarfile.SYMTYPE, linkname="../src"),
        _info("./usr/bin/hard", tarfile.LNKTYPE, linkname="usr/bin/tool"),
        _info("./usr/ro", tarfile.DIRTYPE, mode=0o555),
        ("./usr/ro/inside", b"ro dir still gets its files"),
        ("./usr/src/linux-headers-6.1.85+/Makefile", b"VERSION = 6 (replaced)\n"),
    ], mode="w:xz")
    result = archive.extract(tgz, area / "work/t")
    t = area / "work/t"
    assert result.root == t
    assert (t / "usr/src/linux-headers-6.1.85+/Makefile").read_bytes() == b"VERSION = 6 (replaced)\n"
    assert os.readlink(t / "usr/bin/alias") == "tool"
    assert (t / "usr/lib/dir-link/linux-headers-6.1.85+/Makefile").is_file()
    assert os.stat(t / "usr/bin/hard").st_ino == os.stat(t / "usr/bin/tool").st_ino
    mode = os.stat(t / "usr/bin/tool").st_mode
    assert mode & 0o777 == 0o755 and not mode & 0o7000  # setuid dropped
    assert os.stat(t / "usr/ro").st_mode & 0o777 == 0o755 - 0o200 + 0o200  # owner rwx kept
    assert (t / "usr/ro/inside").is_file()
    assert result.files == 4 and result.links == 3


def test_exclude_patterns_skip_members_and_their_hardlinks(area):
    tgz = make_tar(area / "work/tc.tar.xz", [
        ("bin/x86_64-cos-linux-gnu-gcc", b"cc", 0o755),
        ("usr/lib64/rustlib/x86_64/lib.rlib", b"big"),
        ("usr/lib64/librustc_driver.so", b"big"),
        _info("usr/lib64/link-to-rustc.so", tarfile.LNKTYPE, linkname="usr/lib64/librustc_driver.so"),
        ("usr/lib64/libstd-abc.so", b"big"),
        ("usr/lib64/libc.so", b"keep"),
    ], mode="w:xz")
    exclude = archive.exclude_patterns(("usr/lib64/rustlib*", "usr/lib64/libstd-*.so",
                                        "usr/lib64/librustc*"))
    result = archive.extract(tgz, area / "work/t", exclude=exclude)
    t = area / "work/t"
    assert (t / "bin/x86_64-cos-linux-gnu-gcc").is_file()
    assert (t / "usr/lib64/libc.so").is_file()
    assert not (t / "usr/lib64/rustlib").exists()
    assert not list((t / "usr/lib64").glob("librustc*"))
    assert not (t / "usr/lib64/link-to-rustc.so").exists()
    assert not (t / "usr/lib64/libstd-abc.so").exists()
    assert len(result.skipped) == 4


def test_only_the_ima_xattr_is_applied(area):
    """security.ima (COS firmware signatures) is kept; file capabilities, trusted.* and the
    rest are dropped: an archive must not hand out privileges on the host."""
    info = _info("firmware/gsp.bin", size=4)
    info.pax_headers = {"SCHILY.xattr.security.ima": "\x03\x02sig",
                        "SCHILY.xattr.security.capability": "\x01\x00\x00\x02" + "\x00" * 16,
                        "SCHILY.xattr.trusted.overlay": "y", "SCHILY.xattr.user.test": "sig"}
    tgz = area / "work/fw.tgz"
    with tarfile.open(tgz, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b"data"))
    archive.extract(tgz, area / "work/t", keep_xattrs=True)
    path = area / "work/t/firmware/gsp.bin"
    assert path.read_bytes() == b"data"
    try:
        assert os.getxattr(path, "security.ima") == b"\x03\x02sig"
    except OSError:
        pytest.skip("this filesystem takes no security.ima xattr")
    assert os.listxattr(path) == ["security.ima"]


def test_header_bomb_is_refused_before_it_is_read(area):
    """A GNU long-name header claiming 6 GiB: tarfile would read it whole into memory."""
    tgz = area / "work/bomb.tgz"
    import gzip

    header = tarfile.TarInfo("././@LongLink")
    header.type = tarfile.GNUTYPE_LONGNAME
    header.size = 6 << 30
    with gzip.open(tgz, "wb") as f:
        f.write(header.tobuf(format=tarfile.USTAR_FORMAT))
        f.write(b"a" * (1 << 20))  # the start of the "name"; the rest never comes
    with pytest.raises(IntegrityError, match="extended header") as err:
        archive.extract(tgz, area / "work/t")
    assert err.value.exit_code == ExitCode.INTEGRITY
    assert not (area / "work/t").exists()
    with pytest.raises(tarstream.UnreadableArchive, match="extended header"):
        tarstream.read_first_member(tgz, "manifest.json", 1 << 20)


def test_read_first_member_reads_only_the_named_bounded_first_file(area):
    tgz = make_tar(area / "work/a.tgz", [("m.json", b"{}"), ("rest", b"x" * 4096)])
    assert tarstream.read_first_member(tgz, "m.json", 2) == b"{}"
    with pytest.raises(tarstream.UnreadableArchive, match="larger than 1 bytes"):
        tarstream.read_first_member(tgz, "m.json", 1)
    with pytest.raises(tarstream.UnreadableArchive, match="first member is not rest"):
        tarstream.read_first_member(tgz, "rest", 1 << 20)
    (area / "work/bad.tgz").write_bytes(b"not gzip")
    with pytest.raises(tarstream.UnreadableArchive, match="not a readable tar archive"):
        tarstream.read_first_member(area / "work/bad.tgz", "m.json", 2)


def test_member_count_and_path_length_limits(area):
    many = [(f"f{i}", b"") for i in range(5)]
    refused(area, many, "more than 4 members", max_members=4)
    refused(area, [("d/" + "x" * 300, b"x")], "path too long")


def test_disk_full_while_extracting_is_exit_11(area, monkeypatch):
    import errno

    from installer.base.errors import DiskSpaceError

    tgz = make_tar(area / "work/a.tgz", [("big", b"x" * 4096)])

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(archive, "_copy_hashing", full)
    with pytest.raises(DiskSpaceError) as err:
        archive.extract(tgz, area / "work/t")
    assert err.value.exit_code == ExitCode.DISK_SPACE
    assert not (area / "work/t").exists() and not (area / "work/.t.extracting").exists()


# --------------------------------------------------------------------------- depth and time


def test_members_deeper_than_the_cap_are_refused(area):
    refused(area, [("d/" * archive.MAX_DEPTH + "f", b"x")], "65 directories deep")


def test_symlink_target_deeper_than_the_cap_is_refused(area):
    refused(area, [_info("l", tarfile.SYMTYPE, linkname="d/" * archive.MAX_DEPTH + "f")],
            "components long")


def test_a_path_through_a_file_is_refused_not_a_crash(area):
    refused(area, [("a", b"x"), ("a/b", b"y")], "a path through a file")


def test_members_through_a_link_to_a_dir_inside_land_in_that_dir(area):
    tgz = make_tar(area / "work/ok.tgz", [_info("real", tarfile.DIRTYPE, mode=0o755),
                                           _info("l", tarfile.SYMTYPE, linkname="real"),
                                           ("l/sub/f", b"x")])
    out = area / "work/out"
    archive.extract(tgz, out)
    assert (out / "real/sub/f").read_bytes() == b"x" and (out / "l").is_symlink()


def test_each_directory_is_resolved_once(area, monkeypatch):
    """Members under one deep dir cost one lstat each, not one per level (pre-fix: 76 ms a
    member 800 deep, from realpath on every member's parents)."""
    deep = "d/" * 60
    tgz = make_tar(area / "work/deep.tgz", [(f"{deep}f{i}", b"x") for i in range(200)])
    calls = []
    real_lstat = os.lstat
    monkeypatch.setattr(archive.os, "lstat", lambda *a, **k: calls.append(a) or real_lstat(*a, **k))
    archive.extract(tgz, area / "work/out")
    assert len(calls) < 200  # the 60 levels are checked (made) once


def test_an_extraction_past_its_deadline_is_stopped(area):
    tgz = make_tar(area / "work/slow.tgz", [(f"f{i}", b"x") for i in range(3)])
    with pytest.raises(IntegrityError, match="still extracting after 0 s") as err:
        archive.extract(tgz, area / "work/out", deadline_s=1e-9)
    assert err.value.exit_code == ExitCode.INTEGRITY
    assert not (area / "work/out").exists() and not (area / "work/.out.extracting").exists()


# --------------------------------------------------------------------------- streams, hashes


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_hashes_are_computed_while_writing_links_copy_them_and_a_replaced_path_drops(area):
    tgz = make_tar(area / "work/a.tgz", [
        ("d/a", b"first"),
        _info("d/hard", tarfile.LNKTYPE, linkname="d/a"),
        ("d/b", b"old"),
        _info("d/b", tarfile.SYMTYPE, linkname="a"),  # the file d/b is replaced by a link
        ("real/x", b"x"),
        _info("via", tarfile.SYMTYPE, linkname="real"),
        ("via/y", b"through a linked dir"),
    ])
    result = archive.extract(tgz, area / "work/t")
    assert result.hashes == {"d/a": _sha(b"first"), "d/hard": _sha(b"first"),
                             "real/x": _sha(b"x"), "real/y": _sha(b"through a linked dir")}
    for rel, digest in result.hashes.items():  # what is on disk, read back
        assert _sha((area / "work/t" / rel).read_bytes()) == digest


@pytest.mark.parametrize("compress", ["gz", "xz", "zst", ""])
def test_a_stream_is_read_once_whatever_its_compression(area, compress):
    import zstandard

    members = [("m.json", b"{}"), ("a/b", b"data" * 1000)]
    plain = make_tar(area / "work/a.tar", members, mode="w")
    data = plain.read_bytes()
    if compress == "zst":
        data = zstandard.ZstdCompressor().compress(data)
    elif compress:
        data = make_tar(area / f"work/a.{compress}", members, mode=f"w:{compress}").read_bytes()
    seen: list[bytes] = []
    head = archive.Head("m.json", 10, seen.append)
    result = archive.extract(io.BytesIO(data), area / "work/t", head=head, label="s")
    assert seen == [b"{}"] and not (area / "work/t/m.json").exists()
    assert (area / "work/t/a/b").read_bytes() == b"data" * 1000 and result.files == 1


class _Counting(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.taken = 0

    def read(self, size=-1):
        out = super().read(size)
        self.taken += len(out)
        return out


def test_a_refused_head_stops_before_the_rest_is_read(area):
    big = os.urandom(16 << 20)  # incompressible: the stream is ~16 MB
    data = make_tar(area / "work/a.tgz", [("m.json", b"{}"), ("big", big)]).read_bytes()

    def refuse(_data: bytes) -> None:
        raise IntegrityError("for another kernel")

    source = _Counting(data)
    with pytest.raises(IntegrityError, match="another kernel"):
        archive.extract(source, area / "work/t", head=archive.Head("m.json", 10, refuse))
    # What the inflate thread had read ahead (its queue, a chunk in hand, one in the making).
    assert source.taken <= (tarstream.ReadAhead.DEPTH + 3) * tarstream.STREAM_BUFSIZE < len(data)
    assert not (area / "work/t").exists() and not (area / "work/.t.extracting").exists()


def test_a_head_that_is_not_the_first_member_is_refused(area):
    tgz = make_tar(area / "work/a.tgz", [("other", b"x"), ("m.json", b"{}")])
    with pytest.raises(IntegrityError, match="first member is not m.json"):
        archive.extract(tgz, area / "work/t", head=archive.Head("m.json", 10, lambda _d: None))
    assert not (area / "work/.t.extracting").exists()


def test_a_stream_is_inflated_to_its_end_crc_and_trailing_bytes_checked(area):
    import gzip

    tar = make_tar(area / "work/a.tar", [("a", b"data" * 1000)], mode="w").read_bytes()
    good = gzip.compress(tar)
    bad_crc = good[:-8] + bytes(b ^ 0xFF for b in good[-8:-4]) + good[-4:]
    with pytest.raises(IntegrityError, match="corrupt archive"):
        archive.extract(io.BytesIO(bad_crc), area / "work/t")
    padded = gzip.compress(tar + bytes(2 * tarstream.MAX_TRAILING_BYTES))
    with pytest.raises(IntegrityError, match="bytes after the archive's end"):
        archive.extract(io.BytesIO(padded), area / "work/t")
    assert not (area / "work/t").exists() and not (area / "work/.t.extracting").exists()
    archive.extract(io.BytesIO(good), area / "work/t")
    assert (area / "work/t/a").read_bytes() == b"data" * 1000
