from installer import cache
from installer.cache import CacheKey, CacheRecord

KEY = CacheKey("550.54.14", kernel_release="5.15.0-1049-gke", flavor="compiled-proprietary")


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
    assert out.stdout.split() == ["5.15.0-1049-gke", "550.54.14"]


def test_gke_written_records_are_recognised(tmp_path):
    ubuntu = CacheRecord.parse("CACHE_KERNEL_VERSION=5.15.0-1049-gke\nCACHE_NVIDIA_DRIVER_VERSION=550.54.14\n")
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
    assert rec.mismatch(KEY) == "cached for kernel 5.15.0-1, host runs 5.15.0-1049-gke"
