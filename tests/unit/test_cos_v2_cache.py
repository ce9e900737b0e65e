"""Either installer takes the other's .cache as a hit (cos-gpu-installer v2:
cos/tools src/cmd/cos_gpu_installer/internal/installer/cache.go L14-85 and
src/pkg/utils/utils.go LoadEnvFromFile L227-255)."""

from __future__ import annotations

import pytest

from installer.distros.cos.v2_cache import with_v2_lines
from installer.records import cache
from installer.records.cache import CacheKey, CacheRecord, ModuleSource

BUILD, V = "18244.151.14", "570.158.01"


def v2_load_env(text: str) -> dict[str, str]:
    """v2's reader, in its strictness: a non-blank line without '=' fails the whole read."""
    envs = {}
    for line in text.splitlines():
        line = line.strip()
        if line:
            key, eq, value = line.partition("=")
            if not eq:
                raise ValueError(f"Unrecognized format: {line}")
            envs[key] = value.strip("\"'")
    return envs


def v2_is_cached(text: str, build_id: str, version: str) -> tuple[bool, bool]:
    envs = v2_load_env(text)
    return (envs.get("BUILD_ID") == build_id and envs.get("DRIVER_VERSION") == version,
            envs.get("KERNEL_OPEN") == "Y")


@pytest.mark.parametrize("source, module_type, is_open", [
    (ModuleSource.PREBUILT, "open", True), (ModuleSource.COMPILED, "open", True),
    (ModuleSource.PRECOMPILED, "proprietary", False),
    (ModuleSource.COMPILED, "proprietary", False),
])
def test_v2_reads_our_record_as_a_hit(tmp_path, source, module_type, is_open):
    (tmp_path / "drivers").mkdir()
    (tmp_path / "drivers/nvidia.ko").write_bytes(b"ko")
    key = with_v2_lines(CacheKey(V, build_id=BUILD, source=source,  # as CosFlow.cache_key
                                 module_type=module_type))
    cache.write(tmp_path / ".cache", key, tmp_path, "1.0")
    text = (tmp_path / ".cache").read_text()
    assert v2_is_cached(text, BUILD, V) == (True, is_open)
    assert v2_is_cached(text, "18244.151.15", V)[0] is False
    # ...and we still read our own record fully.
    record = CacheRecord.parse(text)
    assert (record.source, record.module_type) == (source, module_type)
    assert record.mismatch(CacheKey(V, build_id=BUILD)) is None
    assert "drivers/nvidia.ko" in record.file_hashes


def test_ubuntu_record_carries_no_v2_keys(tmp_path):
    cache.write(tmp_path / ".cache", CacheKey(V, kernel_release="6.8.0-1025-gke"), tmp_path, "1")
    envs = v2_load_env((tmp_path / ".cache").read_text())
    assert "BUILD_ID" not in envs and envs["CACHE_KERNEL_VERSION"] == "6.8.0-1025-gke"


@pytest.mark.parametrize("text, source, module_type", [
    # v2 writes its map unordered; KERNEL_OPEN only for the open modules
    (f"DRIVER_VERSION={V}\nKERNEL_OPEN=Y\nBUILD_ID={BUILD}\n", ModuleSource.PREBUILT, "open"),
    (f"BUILD_ID={BUILD}\nDRIVER_VERSION={V}\n", ModuleSource.PRECOMPILED, "proprietary"),
])
def test_we_read_a_v2_record_as_a_hit(tmp_path, text, source, module_type):
    for rel in cache.REQUIRED_FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    (tmp_path / ".cache").write_text(text)
    record = cache.read(tmp_path / ".cache")  # the one reader: ours, GKE's and v2's
    assert record is not None and (record.source, record.module_type) == (source, module_type)
    assert record.mismatch(CacheKey(V, build_id=BUILD)) is None
    assert record.mismatch(CacheKey("535.247.01", build_id=BUILD)) is not None
    assert cache.check_files(record, tmp_path) is None
    (tmp_path / "drivers/nvidia.ko").unlink()
    assert cache.check_files(record, tmp_path) == "drivers/nvidia.ko is missing"
