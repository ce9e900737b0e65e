from installer.records import cache
from installer.records.cache import CacheKey, CacheRecord, ModuleSource
from tests.fixtures.kernel import UBUNTU_KERNEL as RELEASE

KEY = CacheKey("550.54.14", kernel_release=RELEASE, source=ModuleSource.COMPILED,
               module_type="proprietary")


def _install(tmp_path):
    for rel, data in {
        "drivers/nvidia.ko": b"ko",
        "drivers/nvidia-uvm.ko": b"uvm",
        "bin/nvidia-smi": b"smi",
        "lib64/libnvidia-ml.so.550.54.14": b"nvml",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    (tmp_path / "lib64/libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.550.54.14")
    return tmp_path


def test_round_trip_and_hashes_checked(tmp_path):
    root = _install(tmp_path)
    cache.write(root / ".cache", KEY, root, "test")
    record = cache.read(root / ".cache")
    assert record.mismatch(KEY) is None
    assert set(record.file_hashes) == {
        "drivers/nvidia.ko", "drivers/nvidia-uvm.ko", "bin/nvidia-smi",
        "lib64/libnvidia-ml.so.550.54.14"}
    assert cache.check_files(record, root) is None
    (root / "drivers/nvidia-uvm.ko").write_bytes(b"tampered")
    assert cache.check_files(record, root) == "drivers/nvidia-uvm.ko has changed since it was installed"
    (root / "drivers/nvidia-uvm.ko").write_bytes(b"uvm")
    (root / "drivers/nvidia.ko").unlink()
    assert cache.check_files(record, root) == "drivers/nvidia.ko is missing"


def test_written_record_is_valid_shell_with_gke_keys(tmp_path):
    import subprocess

    root = _install(tmp_path)
    cache.write(root / ".cache", KEY, root, "test")
    out = subprocess.run(
        ["sh", "-ec", '. "$1"; echo "$CACHE_KERNEL_VERSION $CACHE_NVIDIA_DRIVER_VERSION"', "sh",
         str(root / ".cache")], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [RELEASE, "550.54.14"]


def test_gke_written_records_are_recognised(tmp_path):
    ubuntu = CacheRecord.parse(
        f"CACHE_KERNEL_VERSION={RELEASE}\nCACHE_NVIDIA_DRIVER_VERSION=550.54.14\n")
    assert ubuntu.mismatch(KEY) is None
    cos_v1 = CacheRecord.parse("CACHE_BUILD_ID=17801.218.41\nCACHE_NVIDIA_DRIVER_VERSION=535.183.01\n")
    assert cos_v1.mismatch(CacheKey("535.183.01", build_id="17801.218.41")) is None
    cos_v2 = CacheRecord.parse("BUILD_ID=17801.218.41\nDRIVER_VERSION=535.183.01\n")
    assert cos_v2.mismatch(CacheKey("535.183.01", build_id="17801.218.41")) is None
    # Without hashes the required files must exist.
    assert cache.check_files(ubuntu, tmp_path) == "drivers/nvidia.ko is missing"
    root = _install(tmp_path)
    assert cache.check_files(ubuntu, root) is None


def test_mismatch_reasons():
    rec = CacheRecord.parse("CACHE_KERNEL_VERSION=5.15.0-1\nCACHE_NVIDIA_DRIVER_VERSION=535.1\n")
    assert rec.mismatch(KEY) == "cached driver 535.1, want 550.54.14"
    rec = CacheRecord.parse("CACHE_KERNEL_VERSION=5.15.0-1\nCACHE_NVIDIA_DRIVER_VERSION=550.54.14\n")
    assert rec.mismatch(KEY) == f"cached for kernel 5.15.0-1, the node runs kernel {RELEASE}"


def _age_record(cache_file, seconds=5):
    """Make the record's mtime clearly later than the files' times (as after a real install)."""
    import os

    future = cache_file.stat().st_mtime_ns + seconds * 10**9
    os.utime(cache_file, ns=(future, future))


def test_unchanged_files_are_not_rehashed(tmp_path, monkeypatch):
    import os

    root = _install(tmp_path)
    cache.write(root / ".cache", KEY, root, "test")
    assert "CACHE_FILE_STAT=" in (root / ".cache").read_text()
    _age_record(root / ".cache")
    record = cache.read(root / ".cache")
    assert set(record.file_stats) == set(record.file_hashes)
    hashed = []
    real_sha = cache.sha256_stream
    monkeypatch.setattr(cache, "sha256_stream", lambda f: hashed.append(f) or real_sha(f))
    assert cache.check_files(record, root) is None
    assert hashed == []  # size, mtime, ctime and inode unchanged: stat is enough

    # Same size, old mtime put back: the ctime still moves, so it is hashed and caught.
    ko = root / "drivers/nvidia-uvm.ko"
    st = ko.stat()
    ko.write_bytes(b"UVM")
    os.utime(ko, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.check_files(record, root) == "drivers/nvidia-uvm.ko has changed since it was installed"
    assert len(hashed) == 1  # that file only


def test_racily_clean_files_are_hashed(tmp_path, monkeypatch):
    root = _install(tmp_path)
    cache.write(root / ".cache", KEY, root, "test")
    record = cache.read(root / ".cache")
    # The record is as new as the files' own times: a same-tick change could hide.
    ctime = max(s[2] for s in record.file_stats.values())
    record = cache.replace(record, written_ns=ctime)
    hashed = []
    real_sha = cache.sha256_stream
    monkeypatch.setattr(cache, "sha256_stream", lambda f: hashed.append(f) or real_sha(f))
    assert cache.check_files(record, root) is None
    assert len(hashed) >= 1
    # A record without stats (older format, or GKE's) is always hashed.
    hashed.clear()
    old = cache.CacheRecord.parse((root / ".cache").read_text().replace("CACHE_FILE_STAT", "X"))
    assert old.file_stats == {}
    assert cache.check_files(old, root) is None
    assert len(hashed) == len(old.file_hashes)


def test_known_hashes_are_used_when_the_size_agrees(tmp_path, monkeypatch):
    """A bundle install hands over the hashes it verified: nothing is read again; a
    size that disagrees (not the file that was verified) is hashed."""
    import hashlib

    root = _install(tmp_path)
    real = {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest()
            for rel in cache.hashed_files(root)}
    known = {rel: (sha, (root / rel).stat().st_size) for rel, sha in real.items()}
    known["bin/nvidia-smi"] = ("f" * 64, 999)  # wrong size: must be hashed, not trusted
    read = []
    monkeypatch.setattr(cache, "sha256_file", lambda p: read.append(p.name) or real[
        p.relative_to(root).as_posix()])
    cache.write(root / ".cache", KEY, root, "test", known)
    assert read == ["nvidia-smi"]
    assert cache.read(root / ".cache").file_hashes == real


def test_the_links_the_loader_follows_are_checked(tmp_path):
    """Issue 39 C1: a record keeps every link under lib64/ and bin/ with its target; a hit
    needs each to lead where it did, no link added, and the loader's links to lead to a
    hashed file (a record written before links were kept: that last check alone)."""
    root = _install(tmp_path)
    (root / "lib64/libcuda.so.550.54.14").write_bytes(b"cuda")
    (root / "lib64/libcuda.so.1").symlink_to("libcuda.so.550.54.14")
    cache.write(root / ".cache", KEY, root, "test")
    record = cache.read(root / ".cache")
    assert record.file_links == {"lib64/libcuda.so.1": "libcuda.so.550.54.14",
                                 "lib64/libnvidia-ml.so.1": "libnvidia-ml.so.550.54.14"}
    assert cache.check_files(record, root) is None
    link = root / "lib64/libcuda.so.1"
    link.unlink()
    link.write_bytes(b"planted")
    assert cache.check_files(record, root) == "lib64/libcuda.so.1 is no longer a link"
    link.unlink()
    (root / "lib64/planted.so").write_bytes(b"planted")
    link.symlink_to("planted.so")
    assert cache.check_files(record, root) == (
        "lib64/libcuda.so.1 now leads to 'planted.so', not 'libcuda.so.550.54.14'")
    old = cache.CacheRecord.parse((root / ".cache").read_text().replace("CACHE_FILE_LINKS", "X"))
    assert old.file_links is None
    assert cache.check_files(old, root) == (
        "lib64/libcuda.so.1 leads to 'planted.so', a file the record does not hash")
    link.unlink()
    link.symlink_to("libcuda.so.550.54.14")
    (root / "lib64/libextra.so.1").symlink_to("planted.so")
    assert cache.check_files(record, root) == "lib64/libextra.so.1 is a link the record does not name"
