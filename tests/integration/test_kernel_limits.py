"""Kernels that cannot load or unload modules (issue 30 §1.1, §1.2), as a real H100 node's
(tests/data/gpu-node): built without CONFIG_MODULE_UNLOAD (``- -`` in /proc/modules,
delete_module ENOSYS) and with ``kernel.modules_disabled=1`` (every load and unload EPERM
until reboot, kernel/module/main.c ``may_init_module``).

A run that must load refuses before any download, naming the setting, ahead of the
signature check it makes moot; a run that needs no load succeeds; a version change on a
kernel that cannot unload is staged for the next boot instead of failing on rmmod.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.fixtures.kernel import FakeKernel
from tests.integration.conftest import V1, V2
from tests.pod import last_event, ok, pod_on

pytestmark = pytest.mark.chroot


@pytest.fixture
def kernel(node, tmp_path):
    k = FakeKernel(tmp_path / "kernel", node.kernel_release, module_unload=False)
    k.add_gpu()
    return k


def _module_calls(kernel, since: int = 0) -> list[dict]:
    return [c for c in kernel.calls()[since:] if c["tool"] in ("insmod", "rmmod", "modprobe")]


def test_the_fake_kernel_prints_what_a_kernel_without_unload_prints(node, pod, kernel):
    ok(pod.run("install"))
    lines = (kernel.proc_dir / "modules").read_text().splitlines()
    nvidia = next(ln for ln in lines if ln.startswith("nvidia "))
    assert nvidia.split()[2:5] == ["-", "-", "Live"]  # procfs.c print_unload_info
    assert not (kernel.sys_dir / "module/nvidia/refcnt").exists()
    assert (kernel.sys_dir / "module/nvidia/initstate").read_text() == "live\n"


def test_detect_and_a_rerun_see_the_driver_loaded(node, pod, kernel):
    """Caught: the '- -' lines were dropped, so detect said no driver and a rerun
    insmod'ed again (EEXIST)."""
    ok(pod.run("install"))
    detected = json.loads(ok(pod.run("detect", "-o", "json")).stdout)
    assert detected["loaded_driver_version"] == V1
    since = len(kernel.calls())
    proc = ok(pod.run("install"))
    assert last_event(proc)["plan"] == "cached"
    assert _module_calls(kernel, since) == []


def test_a_version_change_is_staged_for_the_next_boot_not_failed_on_rmmod(
        node, pod, kernel, server):
    """Without module unload, WHEN_IN_USE=fail (the CLI default) would mean exit 8 that no
    drain can fix: the new version is staged and the running one verified."""
    ok(pod.run("install"))
    since = len(kernel.calls())
    proc = ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2, "WHEN_IN_USE": "fail"}))
    final = last_event(proc)
    assert final["plan"] == "staged" and final["outcome"] == "ok"
    assert "CONFIG_MODULE_UNLOAD" in final["message"]
    assert _module_calls(kernel, since) == []
    assert kernel.loaded()["nvidia"].version == V1
    assert (node.install_dir / ".next-boot/.cache").is_file()
    # After the reboot the staged version installs without a download.
    kernel.unload_all()
    before = len(server.requests)
    ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2}))
    assert kernel.loaded()["nvidia"].version == V2 and server.requests[before:] == []


def test_uninstall_refuses_to_unload_what_this_kernel_cannot(node, pod, kernel):
    ok(pod.run("install"))
    proc = pod.run("uninstall")
    assert proc.returncode == 8, proc.stderr[-2000:]
    assert "cannot unload modules" in last_event(proc)["error"]
    assert (node.install_dir / ".cache").is_file()  # nothing touched
    assert [c for c in kernel.calls() if c["tool"] == "rmmod"] == []


def test_rmmod_says_what_kmod_says(kernel, node, pod):
    ok(pod.run("install"))
    proc = subprocess.run(["rmmod", "nvidia_uvm"], env=kernel.subprocess_env(),
                          capture_output=True, text=True, timeout=30)
    # kmod rmmod.c check_module_inuse: no refcnt attribute -> this line, exit 1.
    assert (proc.returncode, proc.stderr) == (1, "rmmod: ERROR: Module unloading is not supported\n")
    assert "nvidia_uvm" in kernel.loaded()


@pytest.fixture
def disabled_pod(node, tmp_path, server):
    k = FakeKernel(tmp_path / "kernel-d", node.kernel_release)
    k.add_gpu()
    return k, pod_on(node, k, server, tmp_path / "pod-d", env={"NVIDIA_DRIVER_VERSION": V1})


@pytest.mark.parametrize("dry_run", [False, True])
def test_modules_disabled_refuses_before_any_download_and_before_signatures(
        disabled_pod, server, dry_run):
    kernel, pod = disabled_pod
    kernel.set_modules_disabled()
    kernel.set_sig_enforce(True)  # moot: nothing loads at all
    proc = pod.run("install", *(["--dry-run"] if dry_run else []))
    assert proc.returncode == 8, proc.stderr[-2000:]
    final = last_event(proc)
    assert final["step"] == "check_module_loading"
    assert "kernel.modules_disabled=1" in final["error"]
    assert server.requests == [] and _module_calls(kernel) == []


def test_modules_disabled_with_the_wanted_driver_loaded_and_cached_succeeds(disabled_pod, node):
    kernel, pod = disabled_pod
    ok(pod.run("install"))
    kernel.set_modules_disabled()  # a boot script locks module loading after the driver
    since = len(kernel.calls())
    proc = ok(pod.run("install"))
    assert last_event(proc)["plan"] == "cached"
    assert _module_calls(kernel, since) == []
    # Another version, even staged for the next boot: it must load then, and the setting
    # is usually the node image's, so it refuses now, naming it.
    for when_in_use in ("fail", "stage"):
        proc = pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2, "WHEN_IN_USE": when_in_use})
        assert proc.returncode == 8, proc.stderr[-2000:]
        assert last_event(proc)["step"] == "check_module_loading"
        assert "kernel.modules_disabled=1" in last_event(proc)["error"]
    assert not (node.install_dir / ".next-boot").exists()
