"""Step results on the paths where a step is skipped (records/results.py): a fresh plan
filled from the tree staged for the next boot has no extracted .run, and every later step
must cope with that result being absent.

On main the Vulkan ICD step asserted the extracted .run was there: with
VULKAN_ICD_DIR_HOST (GKE's COS DaemonSets set it) and WHEN_IN_USE=stage (the pod's
default), the install after the reboot failed as an internal error (exit 1,
"AssertionError: extract_driver runs first"), as did one filled from a prebuilt bundle."""

from __future__ import annotations

import pytest

from tests.integration.conftest import V1, V2
from tests.pod import events, last_event, ok

pytestmark = pytest.mark.chroot

ICD_HOST = "home/kubernetes/bin/nvidia/vulkan/icd.d"  # GKE's COS DaemonSets' dir
STAGE = {"NVIDIA_DRIVER_VERSION": V2, "WHEN_IN_USE": "stage", "VULKAN_ICD_DIR_HOST": f"/{ICD_HOST}"}


def test_the_next_boot_install_with_a_vulkan_icd_dir(node, pod, kernel, server):
    (node.root / ICD_HOST).mkdir(parents=True)
    ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": V1, "VULKAN_ICD_DIR_HOST": f"/{ICD_HOST}"}))
    kernel.hold("nvidia")
    ok(pod.run("install", env=STAGE))
    kernel.unhold("nvidia")
    kernel.unload_all()  # the reboot
    icd = (node.root / ICD_HOST / "nvidia_icd.json").read_text()
    proc = ok(pod.run("install", env=STAGE))
    assert last_event(proc)["driver_version"] == V2 == kernel.loaded()["nvidia"].version
    seen = {e.get("event"): e for e in events(proc.stderr)}
    assert "next_boot_taken" in seen
    assert "next-boot stage" in seen["vulkan_icd_skipped"]["reason"]
    assert (node.root / ICD_HOST / "nvidia_icd.json").read_text() == icd  # the one there stays
