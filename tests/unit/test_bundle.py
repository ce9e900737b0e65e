"""Bundles (issue 15): names, manifests, the index, packing and the node-side checks.

Hostile inputs each end in one BundleError / IntegrityError naming what is wrong:
a path leaving the layout, a manifest lying about a sha256, an oversized
manifest, a bundle for another kernel, a renamed bundle.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

from installer.base.errors import ExitCode, IntegrityError
from installer.bundle import index, tree
from installer.bundle.fetch import unpack
from installer.cli import main
from installer.commands import bundle_build as build
from installer.host.installdir import InstallDir
from installer.jail import tarstream
from installer.records.bundle_manifest import (
    BundleError,
    BundleKey,
    FileEntry,
    Manifest,
    expand_url,
    index_url,
)
from tests.fixtures.kernel import fake_ko

V, R, OTHER_R = "550.54.14", "5.15.0-1049-gke", "6.8.0-1015-gke"
KEY = BundleKey(V, R, "proprietary")
NAME = f"nvidia-driver-{V}-proprietary-{R}.tar.zst"


def layout(root: Path, release: str = R) -> Path:
    """A staged install tree as a build leaves it: modules, a binary, a library and its link."""
    for mod in ("nvidia", "nvidia-uvm"):
        path = root / "drivers" / f"{mod}.ko"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(fake_ko(mod.replace("-", "_"), release, version=V))
    (root / "bin").mkdir()
    (root / "bin/nvidia-smi").write_bytes(b"\x7fELF smi")
    (root / "bin/nvidia-smi").chmod(0o755)
    (root / "lib64").mkdir()
    (root / f"lib64/libnvidia-ml.so.{V}").write_bytes(b"\x7fELF nvml")
    (root / "lib64/libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{V}")
    (root / f"firmware/nvidia/{V}").mkdir(parents=True)
    (root / f"firmware/nvidia/{V}/gsp_ga10x.bin").write_bytes(b"gsp")
    return root


def manifest_for(root: Path, key: BundleKey = KEY) -> Manifest:
    return build.make_manifest(root, key, compiler="cc (Debian 12.2.0-14) 12.2.0",
                               signed=False, driver_sha256="a" * 64)


def packed(tmp_path: Path, key: BundleKey = KEY, release: str = R) -> build.Written:
    root = layout(tmp_path / "built", release)
    return build.write(root, manifest_for(root, key), tmp_path / "out")


def manifest_doc(**changes) -> bytes:
    doc = json.loads(Manifest(KEY, f"{R} SMP mod_unload", "gcc", False, "t", "0", None,
                              {"drivers/nvidia.ko": FileEntry("b" * 64, 3)}).to_json())
    doc.update(changes)
    return json.dumps(doc).encode()


# -- names and keys ------------------------------------------------------------------


def test_name_round_trips_through_its_keys():
    assert KEY.name() == NAME
    assert BundleKey.from_name(NAME) == KEY


@pytest.mark.parametrize("release", ["../../etc", "a/b", "5.15 0", "", "x" * 200, "-rc1"])
def test_kernel_release_that_could_name_a_path_is_refused(release):
    with pytest.raises(BundleError, match="kernel release"):
        BundleKey(V, release, "open")


@pytest.mark.parametrize("name", ["nvidia-driver-550.54.14-fancy-5.15.0.tar.gz",
                                  "index.json", f"../{NAME}", NAME.replace(".tar.zst", ".tgz"),
                                  NAME.replace(".tar.zst", ".tar.xz")])
def test_a_file_name_that_is_not_a_bundle_name_is_refused(name):
    with pytest.raises(BundleError):
        BundleKey.from_name(name)


# -- manifest ---------------------------------------------------------------------


def test_manifest_round_trips_and_lists_every_file_and_link(tmp_path):
    manifest = manifest_for(layout(tmp_path / "t"))
    again = Manifest.from_json(manifest.to_json().encode())
    assert again == manifest
    assert set(again.files) == {"drivers/nvidia.ko", "drivers/nvidia-uvm.ko", "bin/nvidia-smi",
                                f"lib64/libnvidia-ml.so.{V}", f"firmware/nvidia/{V}/gsp_ga10x.bin"}
    assert again.links == {"lib64/libnvidia-ml.so.1": f"libnvidia-ml.so.{V}"}
    assert again.vermagic.startswith(R + " ")


@pytest.mark.parametrize("changes, error", [
    ({"files": {"../../etc/shadow": {"sha256": "b" * 64, "size": 1}}}, "clean relative path"),
    ({"files": {"/etc/shadow": {"sha256": "b" * 64, "size": 1}}}, "clean relative path"),
    ({"files": {"etc/cron.d/x": {"sha256": "b" * 64, "size": 1}}}, "not inside"),
    ({"files": {"drivers/nvidia.ko": {"sha256": "g" * 64, "size": 1}}}, "sha256"),
    ({"files": {"drivers/nvidia.ko": {"sha256": "b" * 64, "size": -1}}}, "size"),
    ({"files": {"drivers/nvidia.ko": {"sha256": "b" * 64, "size": True}}}, "size"),
    ({"files": {}}, "no drivers/nvidia.ko"),
    ({"links": {"lib64/libx.so": "../../../etc/passwd"}}, "target of link"),
    ({"links": {"lib64/libx.so": "/etc/passwd"}}, "not a relative link"),
    ({"links": {"drivers/nvidia.ko": "x.ko"}}, "as a file and as a link"),
    ({"vermagic": f"{OTHER_R} SMP"}, "not for kernel"),
    ({"kernel_release": "../x"}, "kernel release"),
    ({"format": 2}, "format-1"),
    ({"signed": "yes"}, "signed"),
    ({"compiler": "x" * 10_000}, "compiler"),
])
def test_hostile_manifest_is_refused(changes, error):
    with pytest.raises(BundleError, match=error):
        Manifest.from_json(manifest_doc(**changes))


def test_oversized_or_non_json_manifest_is_refused():
    with pytest.raises(BundleError, match="larger than"):
        Manifest.from_json(b" " * (5 << 20))
    with pytest.raises(BundleError, match="not valid JSON"):
        Manifest.from_json(b"\xff\xfe")


# -- templates ---------------------------------------------------------------------


def test_template_placeholders_are_filled_and_quoted():
    key = BundleKey(V, "6.1.0-rt+1", "open")
    assert expand_url("https://b.example/{driver_version}/{kernel_release}/{module_type}.tgz",
                      key) == "https://b.example/550.54.14/6.1.0-rt%2B1/open.tgz"
    assert expand_url("file:///srv/bundles/", KEY) == f"file:///srv/bundles/{NAME}"
    assert index_url(f"https://b.example/x/{NAME}?sig=s3cret") == "https://b.example/x/index.json"


@pytest.mark.parametrize("url, sha, only, error", [
    ("https://b.example/{kernel}", None, False, "unknown placeholder"),
    ("https://b.example/{driver_version", None, False, "bad --prebuilt-url"),
    ("ftp://b.example/", None, False, "unsupported URL"),
    ("http://b.example/", None, False, "plain http"),
    (None, "a" * 64, False, "need --prebuilt-url"),
    (None, None, True, "need --prebuilt-url"),
    ("https://b.example/", "xyz", False, "64 hex digits"),
])
def test_bad_prebuilt_options_are_usage_errors(capsys, tmp_path, url, sha, only, error):
    args = [*(["--prebuilt-url", url] if url else []), *(["--prebuilt-sha256", sha] if sha else []),
            *(["--prebuilt-only"] if only else [])]
    with pytest.raises(SystemExit) as exit_info:
        main(["install", "--host-root", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == ExitCode.USAGE and error in err and "Traceback" not in err


# -- packing and the index ---------------------------------------------------------


def test_bundle_is_written_with_its_sha256_and_manifest_first(tmp_path):
    written = packed(tmp_path)
    assert written.path.name == NAME
    assert (tmp_path / "out" / f"{NAME}.sha256").read_text() == f"{written.sha256}  {NAME}\n"
    assert written.path.read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # zstd, whatever the name
    with written.path.open("rb") as raw, tarstream.open_stream(raw) as tar:
        members = list(tar)
        assert members[0].name == "manifest.json"
        assert {m.uid for m in members} == {0}
    assert index.read_manifest(written.path) == written.manifest
    assert not list((tmp_path / "out").glob(".*.part"))


def test_build_refuses_modules_built_for_another_kernel(tmp_path):
    root = layout(tmp_path / "t", release=OTHER_R)
    with pytest.raises(Exception, match=f"built for kernel {OTHER_R}, not {R}"):
        manifest_for(root)


def test_index_lists_bundles_and_refuses_a_renamed_one(tmp_path):
    written = packed(tmp_path)
    out = written.path.parent
    renamed = out / BundleKey(V, OTHER_R, "proprietary").name()
    renamed.write_bytes(written.path.read_bytes())  # a bundle for R served as OTHER_R's
    entries, refused = index.update(out)
    assert list(entries) == [NAME]
    assert entries[NAME].sha256 == written.sha256
    assert entries[NAME].summary["vermagic"].startswith(R)
    assert len(refused) == 1 and f"its manifest is for {NAME}" in refused[0]
    assert index.parse((out / "index.json").read_text()) == entries


def test_index_keeps_entries_of_bundles_moved_away_unless_pruned(tmp_path):
    written = packed(tmp_path)
    out = written.path.parent
    index.update(out)
    written.path.unlink()
    assert list(index.update(out)[0]) == [NAME]
    assert index.update(out, prune=True)[0] == {}


def test_index_entry_whose_keys_disagree_with_its_name_is_refused():
    doc = {"format": 1, "bundles": {NAME: {"sha256": "c" * 64, "size": 1, "driver_version": V,
                                           "kernel_release": OTHER_R, "module_type": "proprietary"}}}
    with pytest.raises(BundleError, match="kernel_release"):
        index.parse(json.dumps(doc))


def test_bundle_whose_first_member_is_not_the_manifest_is_not_indexed(tmp_path):
    path = tmp_path / NAME
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("drivers/nvidia.ko")
        tar.addfile(info, io.BytesIO())
    with pytest.raises(BundleError, match="first member is not manifest.json"):
        index.entry_for(path)


# -- the node side: unpack into staging ----------------------------------------------


def staging(tmp_path: Path):
    return InstallDir(tmp_path / "install", Path("/home/kubernetes/bin/nvidia")).new_staging()


def test_unpack_stages_the_layout_exactly(tmp_path):
    written = packed(tmp_path)
    stage = staging(tmp_path)
    manifest = unpack(written.path, stage, KEY, R)
    assert manifest == written.manifest
    assert tree.differences(stage.root, manifest.files, manifest.links) == []
    assert (stage.root / "bin/nvidia-smi").stat().st_mode & 0o111
    assert not (stage.root / "bundle").exists()


def test_unpack_refuses_a_bundle_for_another_kernel(tmp_path):
    written = packed(tmp_path)
    with pytest.raises(IntegrityError, match=f"built for kernel {R}, the running kernel is "
                       f"{OTHER_R}") as err:
        unpack(written.path, staging(tmp_path), KEY, OTHER_R)
    assert err.value.exit_code == ExitCode.INTEGRITY


def test_unpack_refuses_a_bundle_holding_another_key(tmp_path):
    written = packed(tmp_path)
    with pytest.raises(IntegrityError, match="holds driver 550.54.14 .proprietary. for kernel"):
        unpack(written.path, staging(tmp_path), BundleKey(V, R, "open"), R)


def repack(src: Path, dest: Path, edit) -> Path:
    """``src``'s members through ``edit(info, data) -> [(info, data), ...]`` into ``dest``,
    gzip-compressed (as bundles were before zstd) whatever its name says."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with (src.open("rb") as raw, tarstream.open_stream(raw) as tin,
          tarfile.open(dest, "w:gz") as tout):
        for info in tin:
            data = tin.extractfile(info).read() if info.isreg() else None
            for new_info, new_data in edit(info, data):
                if new_data is not None:
                    new_info.size = len(new_data)
                tout.addfile(new_info, io.BytesIO(new_data) if new_data is not None else None)
    return dest


def test_unpack_refuses_a_manifest_lying_about_a_sha256(tmp_path):
    written = packed(tmp_path)

    def swap_smi(info, data):
        # as long as the real one: a longer one is refused sooner, by the declared sizes
        return [(info, b"\x7fELF evl" if info.name == "bin/nvidia-smi" else data)]

    evil = repack(written.path, tmp_path / NAME, swap_smi)
    with pytest.raises(IntegrityError, match="bin/nvidia-smi has sha256 .* the manifest says"):
        unpack(evil, staging(tmp_path), KEY, R)


def test_unpack_refuses_path_traversal_and_extra_files(tmp_path):
    written = packed(tmp_path)

    def add(name):
        def edit(info, data):
            extra = tarfile.TarInfo(name)
            # empty: within the declared sizes, so the tree checks are what refuse it
            return [(info, data)] + ([(extra, b"")] if info.name == "manifest.json" else [])
        return edit

    evil = repack(written.path, tmp_path / "a" / NAME, add("../../etc/cron.d/x"))
    with pytest.raises(IntegrityError, match="'..' path component"):
        unpack(evil, staging(tmp_path), KEY, R)
    extra = repack(written.path, tmp_path / "b" / NAME, add("run-me.sh"))
    with pytest.raises(IntegrityError, match="holds run-me.sh beside the install layout"):
        unpack(extra, staging(tmp_path), KEY, R)
    unlisted = repack(written.path, tmp_path / "c" / NAME, add("lib64/libextra.so"))
    with pytest.raises(IntegrityError, match="lib64/libextra.so is not in the manifest"):
        unpack(unlisted, staging(tmp_path), KEY, R)


def test_a_gzip_bundle_built_before_zstd_is_still_read_and_indexed(tmp_path):
    """Bundles already published are .tar.gz: read by their magic bytes, indexed."""
    written = packed(tmp_path)
    old = repack(written.path, tmp_path / "old" / KEY.name(".tar.gz"), lambda i, d: [(i, d)])
    assert old.read_bytes()[:2] == b"\x1f\x8b"
    manifest = unpack(old, staging(tmp_path), KEY, R)
    assert manifest == written.manifest
    shutil.copy(written.path, old.parent / written.path.name)
    entries, refused = index.update(old.parent)
    assert sorted(entries) == sorted(KEY.names()) and refused == []


def _ctx(pinned=None):
    from types import SimpleNamespace

    return SimpleNamespace(http=None, settings=SimpleNamespace(
        prebuilt_sha256=pinned))


def test_a_directory_url_finds_the_bundle_in_the_index_under_either_name(tmp_path):
    from installer.bundle.fetch import _candidates

    packed(tmp_path)
    out = tmp_path / "out"
    gz = repack(out / NAME, out / KEY.name(".tar.gz"), lambda i, d: [(i, d)])
    (out / NAME).unlink()
    entries, _ = index.update(out)
    template = out.as_uri() + "/"
    assert _candidates(_ctx(), template, KEY) == [(gz.as_uri(), entries[gz.name].sha256)]
    shutil.copy(gz, out / NAME)  # both published: zstd is preferred
    entries, _ = index.update(out)
    assert _candidates(_ctx(), template, KEY) == [((out / NAME).as_uri(), entries[NAME].sha256)]
    # Pinned by hand, no index read: both names are tried, zstd first.
    assert _candidates(_ctx("a" * 64), template, KEY) == [
        ((out / n).as_uri(), "a" * 64) for n in KEY.names()]
    (out / "index.json").unlink()
    assert _candidates(_ctx(), template, KEY) == [((out / n).as_uri(), None) for n in KEY.names()]


# -- signing with the kernel's scripts/sign-file -------------------------------------

SIGN_FILE = f"""#!{sys.executable}
# Stand-in for the kernel's scripts/sign-file: HASH KEY X509 MODULE, appends a signature.
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from installer.kmod.modsign import append_signature
from tests.fixtures.fakekmod import fake_pkcs7
hash_algo, key, cert, module = sys.argv[1:5]
if open(key).read() != "KEY":
    sys.exit("sign-file: bad key")
if hash_algo != "sha256":  # the fake PKCS#7 (what the fake kernel verifies) is SHA-256 only
    sys.exit(f"sign-file: fake signs sha256, not {{hash_algo}}")
data = open(module, "rb").read()
open(module, "wb").write(append_signature(data, fake_pkcs7(data)))
"""


def test_sign_modules_uses_the_headers_sign_file(tmp_path):
    from types import SimpleNamespace

    from installer.base.errors import BuildError
    from installer.host.runner import Runner
    from installer.kmod.headers import KernelTree
    from installer.kmod.modsign import parse_signature
    from installer.records.results import HeadersReady, Results, Staged
    from tests.fixtures.fakekmod import fake_pkcs7

    headers = tmp_path / "headers"
    (headers / "scripts").mkdir(parents=True)
    (headers / "scripts/sign-file").write_text(SIGN_FILE)
    (headers / "scripts/sign-file").chmod(0o755)
    key, cert = tmp_path / "mok.key", tmp_path / "mok.crt"
    key.write_text("KEY")
    cert.write_text("CERT")
    stage = staging(tmp_path)
    layout(stage.root / "t")
    for ko in (stage.root / "t/drivers").iterdir():
        ko.rename(stage.drivers / ko.name)
    results = Results()
    results.add("prepare_staging", Staged(stage))
    results.add("find_kernel_headers", HeadersReady(KernelTree(headers, headers)))
    ctx = SimpleNamespace(results=results, runner=Runner())
    unsigned = {ko.name: ko.read_bytes() for ko in stage.drivers.glob("*.ko")}
    build.sign_modules(build.Signing(key, cert)).run(ctx)
    for ko in stage.drivers.glob("*.ko"):
        assert parse_signature(ko.read_bytes()).pkcs7 == fake_pkcs7(unsigned[ko.name])
    key.write_text("WRONG")
    with pytest.raises(BuildError, match="sign-file failed for nvidia"):
        build.sign_modules(build.Signing(key, cert)).run(ctx)
