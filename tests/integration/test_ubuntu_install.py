"""The Ubuntu flow end to end, run as the pod runs it, against a fixture node.

Real: the makeself .run and its self-check, the HTTPS server (private CA), the
overlay/chroot sandbox around nvidia-installer, ldconfig on both roots, the
host lock. Stand-ins: the kernel (fake procfs/sysfs driven by kmod stand-ins),
nvidia-smi's hardware.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.kernel import UBUNTU_KERNEL as RELEASE
from tests.fixtures.node import INSTALL_HOST, tree_digest
from tests.fixtures.runfile import build_driver_run
from tests.integration.conftest import V1, V2
from tests.pod import events, last_event, ok, reboot_then_cached_install

pytestmark = pytest.mark.chroot


def loads(kernel) -> list[str]:
    """'insmod nvidia.ko', 'modprobe drm_kms_helper', 'rmmod nvidia_drm' in call order."""
    return [f"{c['tool']} {Path(c['argv'][-1] if c['tool'] == 'modprobe' else c['argv'][0]).name}"
            for c in kernel.calls() if c["tool"] in ("insmod", "modprobe", "rmmod")]


def test_fresh_install_lays_out_the_host(node, pod, kernel, server):
    proc = ok(pod.run("install"))
    final = last_event(proc)
    assert final["event"] == "install_finished" and final["plan"] == "fresh"
    assert final["driver_version"] == V1

    install = node.install_dir
    for rel in ("bin/nvidia-smi", "bin/nvidia-modprobe", "drivers/nvidia.ko", "drivers/nvidia-uvm.ko",
                "drivers/nvidia-modeset.ko", "drivers/nvidia-drm.ko", f"lib64/libcuda.so.{V1}",
                "lib64/libnvidia-ml.so.1", f"firmware/nvidia/{V1}/gsp_ga10x.bin"):
        assert (install / rel).exists(), rel
    # Noise nvidia-installer writes elsewhere is discarded, not shipped.
    assert not list(install.rglob("nvidia.icd"))
    assert not (install / ".staging").exists()
    cache_text = (install / ".cache").read_text()
    assert f"CACHE_KERNEL_VERSION={RELEASE}" in cache_text
    assert f"CACHE_NVIDIA_DRIVER_VERSION={V1}" in cache_text
    status = json.loads((install / "status.json").read_text())
    assert status["outcome"] == "ok" and status["plan"] == "fresh"

    # What a node gets (README): nvidia and nvidia-uvm, in dependency order, the in-tree
    # module nvidia depends on (modinfo -F depends: drm) via modprobe -d <host root>; the
    # display modules only with --display-modules (test below).
    assert loads(kernel) == ["modprobe drm", "insmod nvidia.ko", "insmod nvidia-uvm.ko"]
    assert kernel.calls("init_module") == []  # NVIDIA's installer test-loaded nothing
    modprobe = kernel.calls("modprobe")[0]["argv"]
    assert modprobe[:2] == ["-d", "/root"]  # the host root as the pod sees it
    assert {"nvidia", "nvidia_uvm"} <= set(kernel.loaded())
    assert not {"nvidia_modeset", "nvidia_drm"} & set(kernel.loaded())
    assert (kernel.dev_dir / "nvidiactl").exists() and (kernel.dev_dir / "nvidia-uvm").exists()
    assert not (kernel.dev_dir / "nvidia-modeset").exists()

    # The host's ld cache resolves the library in the host's view of the install dir (real ldconfig).
    drop_in = node.root / "etc/ld.so.conf.d/nvidia.conf"
    assert drop_in.read_text() == f"{INSTALL_HOST}/lib64\n"
    cache = subprocess.run(["ldconfig", "-p", "-C", str(node.root / "etc/ld.so.cache")],
                           capture_output=True, text=True, check=True).stdout
    assert f"libnvidia-ml.so.1 (libc6,x86-64) => {INSTALL_HOST}/lib64/libnvidia-ml.so.1" in cache

    # This machine's own system dirs were never touched (the sandbox is an overlay).
    assert not Path("/usr/bin/nvidia-smi").exists()
    assert not Path("/etc/OpenCL/vendors/nvidia.icd").exists()


def test_display_modules_load_in_dependency_order_when_asked(node, pod, kernel):
    ok(pod.run("install", env={"NVIDIA_DISPLAY_MODULES": "1"}))
    assert loads(kernel) == ["modprobe drm", "insmod nvidia.ko", "insmod nvidia-uvm.ko",
                             "modprobe video", "insmod nvidia-modeset.ko",
                             "modprobe drm_kms_helper", "insmod nvidia-drm.ko"]
    assert {"nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"} <= set(kernel.loaded())
    assert (kernel.dev_dir / "nvidia-modeset").exists()  # nvidia-modprobe -m, modeset loaded


def test_rerun_is_a_cache_hit_without_download_or_double_load(node, pod, kernel, server):
    ok(pod.run("install"))
    requests_before = len(server.requests)
    calls_before = len(kernel.calls())
    proc = ok(pod.run("install"))
    assert last_event(proc)["plan"] == "cached"
    assert len(server.requests) == requests_before
    new_calls = kernel.calls()[calls_before:]
    assert not [c for c in new_calls if c["tool"] in ("insmod", "modprobe")]
    # ld.so.conf entry is never duplicated across runs.
    assert (node.root / "etc/ld.so.conf.d/nvidia.conf").read_text().count("lib64") == 1


def test_reboot_loads_from_cache(node, pod, kernel, server):
    ok(pod.run("install"))
    assert reboot_then_cached_install(pod, kernel, server)[1] == []
    assert {"nvidia", "nvidia_uvm"} <= set(kernel.loaded())
    assert kernel.loaded()["nvidia"].version == V1


def test_driver_version_change_reinstalls_and_replaces_loaded_modules(node, pod, kernel, server):
    ok(pod.run("install"))
    proc = ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2}))
    assert last_event(proc)["plan"] == "fresh"
    assert kernel.loaded()["nvidia"].version == V2
    assert "rmmod nvidia_uvm" in loads(kernel) and "rmmod nvidia" in loads(kernel)
    assert f"CACHE_NVIDIA_DRIVER_VERSION={V2}" in (node.install_dir / ".cache").read_text()
    assert (node.install_dir / f"lib64/libcuda.so.{V2}").exists()
    assert not (node.install_dir / f"lib64/libcuda.so.{V1}").exists()


def test_in_use_driver_is_not_replaced(node, pod, kernel, server):
    ok(pod.run("install"))
    before = tree_digest(node.install_dir)
    kernel.hold("nvidia")
    requests_before = len(server.requests)
    proc = pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2})
    assert proc.returncode == 8, proc.stderr[-2000:]
    final = last_event(proc)
    assert final["error_class"] == "module_load" and "in use" in final["error"]
    assert len(server.requests) == requests_before  # refused before downloading
    assert kernel.loaded()["nvidia"].version == V1
    after = tree_digest(node.install_dir)
    assert {k: v for k, v in after.items() if k != "status.json"} == {
        k: v for k, v in before.items() if k != "status.json"}


def test_bad_sha256_keeps_last_good_install(node, pod, kernel, server):
    ok(pod.run("install"))
    before = tree_digest(node.install_dir)
    proc = pod.run("install", "--force", env={"NVIDIA_DRIVER_SHA256": "0" * 64})
    assert proc.returncode == 6, proc.stderr[-2000:]
    final = last_event(proc)
    assert final["error_class"] == "integrity" and "sha256" in final["error"].lower()
    after = tree_digest(node.install_dir)
    assert {k: v for k, v in after.items() if k != "status.json"} == {
        k: v for k, v in before.items() if k != "status.json"}
    status = json.loads((node.install_dir / "status.json").read_text())
    assert status["outcome"] == "error" and status["exit_code"] == 6


def test_404_is_a_download_failure(node, pod, server):
    proc = pod.run("install", env={"NVIDIA_DRIVER_VERSION": "999.99.99"})
    assert proc.returncode == 5, proc.stderr[-2000:]
    final = last_event(proc)
    assert "999.99.99" in final["error"] and final["error_class"] == "download"
    assert not (node.install_dir / ".cache").exists()


def test_missing_headers_exit_7_before_download(node, pod, server):
    import shutil

    shutil.rmtree(node.root / f"usr/src/linux-headers-{RELEASE}")
    proc = pod.run("install")
    assert proc.returncode == 7, proc.stderr[-2000:]
    final = last_event(proc)
    assert f"/usr/src/linux-headers-{RELEASE}" in final["error"]
    assert "apt-get install" in final["error"]  # the in-container fallback was tried too
    assert server.requests == []


def test_broken_build_exit_7_with_installer_error(node, pod, server):
    (node.root / f"usr/src/linux-headers-{RELEASE}/.fake-build-fails").write_text("")
    proc = pod.run("install")
    assert proc.returncode == 7, proc.stderr[-2000:]
    error = last_event(proc)["error"]
    # NVIDIA's Makefile failed (nvidia-installer never ran); the compiler's first error,
    # what a person fixes, is the message.
    assert error.startswith("building NVIDIA's kernel modules failed (make exit 2): "
                            "nvidia/nv.c:1: error: implicit declaration"), error
    kept = (node.install_dir / "nvidia-installer.failed.log").read_text()
    assert "make[1]: *** [Makefile:1913:" in kept
    assert not (node.install_dir / ".cache").exists()


def test_signature_enforcement_exit_10_before_download(node, pod, kernel, server):
    kernel.set_sig_enforce(True)
    proc = pod.run("install")
    assert proc.returncode == 10, proc.stderr[-2000:]
    assert server.requests == []


def test_dry_run_changes_nothing(node, pod, kernel, server):
    before = tree_digest(node.root)
    proc = ok(pod.run("install", "--dry-run", "-o", "json"))
    plan = json.loads(proc.stdout)
    assert plan["kind"] == "fresh" and plan["driver_version"] == V1
    assert [s["name"] for s in plan["steps"]][:5] == [
        "check_gpu_compatibility", "check_module_loading", "check_module_signing",
        "check_loaded_driver",
        "prepare_staging"]
    assert tree_digest(node.root) == before
    assert server.requests == [] and kernel.calls() == []


def test_lock_held_exit_4(node, pod):
    import fcntl

    lock = node.root / "tmp/cos_gpu_installer_lock"
    lock.parent.mkdir(exist_ok=True)
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        proc = pod.run("install")
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert "host lock" in last_event(proc)["error"]


def test_http_refused_exit_2(pod):
    proc = pod.run("install", env={"NVIDIA_DRIVER_BASE_URL": "http://127.0.0.1:9/tesla"},
                   chroot=False)
    assert proc.returncode == 2, proc.stderr
    assert "--allow-insecure-http" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("os_release", [None, 'ID=fedora\nPRETTY_NAME="Fedora 40"\n'])
def test_unreadable_or_unknown_host_exit_3(node, pod, os_release):
    path = node.root / "etc/os-release"
    if os_release is None:
        path.unlink()
    else:
        path.write_text(os_release)
    proc = pod.run("install", chroot=False)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert last_event(proc)["error_class"] == "unsupported_host"


def test_tampered_cache_is_a_miss(node, pod, kernel, server):
    ok(pod.run("install"))
    kernel.unload_all()
    (node.install_dir / "drivers/nvidia-uvm.ko").write_bytes(b"corrupt")
    proc = ok(pod.run("install"))
    assert last_event(proc)["plan"] == "fresh"
    miss = [e for e in events(proc.stderr) if e.get("event") == "cache_miss"]
    assert "nvidia-uvm.ko has changed" in miss[0]["reason"]


def test_modules_built_for_another_kernel_never_unload_the_working_driver(node, pod, kernel, server):
    ok(pod.run("install"))
    before = tree_digest(node.install_dir)
    other = "5.15.0-9999-other"
    import shutil

    headers = node.root / f"usr/src/linux-headers-{other}"
    shutil.copytree(node.root / f"usr/src/linux-headers-{RELEASE}", headers, symlinks=True)
    (headers / "include/config/kernel.release").write_text(other + "\n")
    proc = pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2, "KERNEL_RELEASE": other})
    assert proc.returncode == 8, proc.stderr[-2000:]
    final = last_event(proc)
    assert other in final["error"] and RELEASE in final["error"]
    assert kernel.loaded()["nvidia"].version == V1  # never unloaded
    assert not [c for c in kernel.calls("rmmod")]
    after = tree_digest(node.install_dir)
    assert {k: v for k, v in after.items() if k != "status.json"} == {
        k: v for k, v in before.items() if k != "status.json"}


def test_status_and_verify_commands(node, pod, kernel, server):
    never = pod.run("status")
    assert never.returncode == 12 and "the installer has not run on this node" in never.stderr
    ok(pod.run("install"))
    status = json.loads(ok(pod.run("status", "-o", "json")).stdout)
    assert status["last_run"]["outcome"] == "ok"
    assert status["cache"]["CACHE_NVIDIA_DRIVER_VERSION"] == V1
    gpus = json.loads(ok(pod.run("verify", "-o", "json")).stdout)
    assert gpus == [{"name": "NVIDIA L4", "driver_version": V1, "bus_id": "00000000:00:04.0"}]
    kernel.unload_all()  # a reboot before the installer ran again
    broken = pod.run("verify", "-o", "json")  # its log lines follow -o (issue 34)
    assert broken.returncode == 9, broken.stderr
    assert "device nodes missing" in last_event(broken)["error"]
    failed = pod.run("install", env={"NVIDIA_DRIVER_VERSION": "999.99.99"})
    assert failed.returncode == 5
    after = pod.run("status", "-o", "json")
    assert after.returncode == 5  # status mirrors the last run's exit code
    assert json.loads(after.stdout)["last_run"]["error_class"] == "download"


def test_lockdown_refusing_cached_unsigned_modules_is_exit_10(node, pod, kernel, server):
    ok(pod.run("install"))
    kernel.unload_all()
    kernel.set_lockdown("integrity")  # e.g. Secure Boot turned on since the last boot
    proc = pod.run("install")
    assert proc.returncode == 10, proc.stderr[-2000:]
    final = last_event(proc)
    assert final["error_class"] == "secure_boot" and "Operation not permitted" in final["error"]
    assert "nvidia" not in kernel.loaded()


def test_params_for_an_already_loaded_module_are_reported_not_applied(node, pod, kernel, server):
    """When nothing says which parameters the loaded driver got (no readiness file this boot:
    loaded by someone else, or by an installer before NVIDIA_MODULE_ARGS was recorded), it is
    not reloaded on a guess; /proc/driver/nvidia/params shows what differs (test_upgrades:
    the recorded case)."""
    ok(pod.run("install"))
    (node.root / "run/nvidia/validations/driver-ready").unlink()
    proc = ok(pod.run("install", "--module-arg", "nvidia.NVreg_EnableGpuFirmware=0"))
    warning = [e for e in events(proc.stderr) if e.get("event") == "module_params_not_applied"]
    assert warning and warning[0]["params"] == ["NVreg_EnableGpuFirmware=0"]
    assert "uninstall then install" in warning[0]["hint"]


def test_nvidia_installer_builds_with_the_real_dev_proc_and_sys(node, pod, kernel, server):
    """An overlay of / shows no submounts and a registry image's /dev is empty: without
    binds the first `> /dev/null` makes a plain file that kbuild's cc-option compiles."""
    ok(pod.run("install"))
    log = (node.install_dir / "kernel-build.log").read_text()  # make's output, kept
    assert ("build environment: /dev/null is character special file; /proc/self/exe is "
            "symbolic link; /sys/kernel is directory") in log


V535_EARLIER = "535.104.05"  # a 535 node upgraded to V2 (535.183.01)


def _events(proc, name):
    return [e for e in events(proc.stderr) if e.get("event") == name]


def test_r535_upgrade_with_the_old_driver_loaded(node, pod, kernel, server, tmp_path):
    """535 has no --skip-module-load: run the old way, NVIDIA's installer would rmmod the
    running 535 and test-load its build into the host kernel (kernel.c
    check_for_unloaded_kernel_module, test_kernel_modules: init_module, EEXIST with the
    old one in). NVIDIA's Makefile builds, nvidia-installer --no-kernel-module installs
    user space, and the only unloads and loads are ours, after the checks."""
    server.serve_run(V535_EARLIER, build_driver_run(tmp_path / "runs", V535_EARLIER))
    ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": V535_EARLIER}))
    assert kernel.loaded()["nvidia"].version == V535_EARLIER
    before = len(loads(kernel))
    proc = ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2}))
    make = _events(proc, "kernel_modules_build_started")[-1]["argv"]
    assert make[:3] == ["make", "-C", "/tmp/nvidia-driver-installer/extract/kernel"]
    assert f"SYSSRC=/root/usr/src/linux-headers-{RELEASE}" in make and make[-1] == "modules"
    argv = _events(proc, "nvidia_installer_started")[-1]["argv"]
    assert "--no-kernel-module" in argv and "--skip-module-load" not in argv
    assert kernel.calls("init_module") == []  # nothing test-loaded during the build
    assert loads(kernel)[before:] == [
        "rmmod nvidia_uvm", "rmmod nvidia", "insmod nvidia.ko",
        "insmod nvidia-uvm.ko"]  # drm stayed loaded
    assert kernel.loaded()["nvidia"].version == V2


def test_upgrade_unloads_the_modules_that_hold_nvidia_first(node, pod, kernel, server):
    """RDMA/GDS/GDRCopy/vGPU modules hold nvidia through its exported symbols: they come out
    first, in the order NVIDIA's own tools use (conflicting-kernel-modules.c; NVIDIA's
    k8s-driver-manager unloadDriver), and are not mistaken for a workload using the GPU."""
    from tests.fixtures.kernel import fake_ko

    display = {"NVIDIA_DISPLAY_MODULES": "1"}  # all four NVIDIA modules hold nvidia here
    ok(pod.run("install", env=display))
    for name in ("gdrdrv", "nvidia_fs", "nv_peer_mem", "nvidia_vgpu_vfio"):
        kernel.preload(fake_ko(name, RELEASE, version="1.0", depends=("nvidia",)))
    before = len(loads(kernel))
    proc = ok(pod.run("install", env={**display, "NVIDIA_DRIVER_VERSION": V2}))
    assert "in use" not in proc.stderr
    assert loads(kernel)[before:before + 9] == [
        "rmmod nv_peer_mem", "rmmod nvidia_fs", "rmmod gdrdrv", "rmmod nvidia_vgpu_vfio",
        "rmmod nvidia_uvm", "rmmod nvidia_drm", "rmmod nvidia_modeset", "rmmod nvidia",
        "insmod nvidia.ko"]
    assert kernel.loaded()["nvidia"].version == V2


def test_install_only_puts_the_driver_in_place_and_loads_nothing(node, pod, kernel, server):
    proc = ok(pod.run("install", "--install-only"))
    assert "nvidia" not in kernel.loaded() and not kernel.calls("insmod")
    assert not kernel.calls("nvidia-smi") and not kernel.devices()
    assert (node.install_dir / "drivers/nvidia.ko").exists()
    assert (node.install_dir / ".cache").is_file()
    assert "nothing loaded or verified" in last_event(proc)["message"]
    # The next plain run loads what is there: a cache hit.
    assert last_event(ok(pod.run("install")))["plan"] == "cached"
    assert kernel.loaded()["nvidia"].version == V1
    # Another version under a loaded driver: refused before any download, nothing changed.
    before = tree_digest(node.install_dir)
    requests = len(server.requests)
    proc = pod.run("install", "--install-only", env={"NVIDIA_DRIVER_VERSION": V2})
    assert proc.returncode == 8, proc.stderr[-2000:]
    assert "--install-only never unloads it" in last_event(proc)["error"]
    assert len(server.requests) == requests and kernel.loaded()["nvidia"].version == V1
    after = tree_digest(node.install_dir)
    assert {k: v for k, v in after.items() if k != "status.json"} == {
        k: v for k, v in before.items() if k != "status.json"}


def test_module_args_reach_the_loaded_module(node, pod, kernel, server):
    """--module-arg values are the loaded module's parameters, and nothing else is:
    no NVreg_ModifyDeviceFiles=0 from a test load left behind."""
    ok(pod.run("install", "--module-arg", "nvidia.NVreg_EnableGpuFirmware=0",
               "--module-arg", "nvidia-uvm.uvm_disable_hmm=1",
               env={"NVIDIA_DRIVER_VERSION": V2}))
    loaded = kernel.loaded()
    assert loaded["nvidia"].params == {"NVreg_EnableGpuFirmware": "0"}
    assert loaded["nvidia_uvm"].params == {"uvm_disable_hmm": "1"}
    # nvidia.ko's options are not in sysfs (permission 0): /proc/driver/nvidia/params has them.
    assert not (kernel.sys_dir / "module/nvidia/parameters").exists()
    assert "EnableGpuFirmware: 0\n" in (kernel.proc_dir / "driver/nvidia/params").read_text()
    assert kernel.calls("init_module") == []
