"""The .run's Vulkan ICD file: nvidia_icd.json (435+) or the older template."""

from __future__ import annotations

import json

from installer.steps.vulkan_icd import icd_text


def test_finished_json_is_taken_as_is(tmp_path):
    text = '{"file_format_version": "1.0.1", "ICD": {"library_path": "libGLX_nvidia.so.0"}}'
    (tmp_path / "nvidia_icd.json").write_text(text)
    assert icd_text(tmp_path) == text


def test_template_gets_the_glx_library(tmp_path):
    (tmp_path / "nvidia_icd.json.template").write_text(
        '{"file_format_version": "1.0.0", "ICD": {"library_path": "__NV_VK_ICD__", '
        '"api_version": "1.1.99"}}')
    assert json.loads(icd_text(tmp_path))["ICD"]["library_path"] == "libGLX_nvidia.so.0"


def test_none_or_broken_is_none(tmp_path):
    assert icd_text(tmp_path) is None
    (tmp_path / "nvidia_icd.json").write_text("{not json")
    assert icd_text(tmp_path) is None
