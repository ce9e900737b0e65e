"""The COS flow end to end, run as the pod runs it, against a fixture COS node.

Real: the makeself .run, the HTTPS artifact server (private CA) serving the
cos-tools layout of docs/contract.md §6, safe extraction of the build's headers and
toolchain into the host's /var/lib/cos-tools, the overlay/chroot sandbox
around nvidia-installer, ldconfig, the host lock. Stand-ins: the kernel (fake
procfs/sysfs + kmod), the toolchain (a script compiler), nvidia-smi's hardware.
The fake nvidia-installer is wrapped to append the environment it ran with to
its log, so the tests see the CC/PATH/headers a real build would have used.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cosbucket import (
    CC,
    CXX,
    DEFAULT_V,
    EVIL_PATHS,
    LATEST_V,
    SIGNED_MODULES,
    TRIPLE,
    Bucket,
    custom_run,
    env_recording_run,
    fake_pkcs7,
    recorded_env,
    signed_modules,
)
from tests.fixtures.node import COS_BUILD_ID, COS_KERNEL, INSTALL_HOST, build_cos_node, tree_digest
from tests.fixtures.runfile import KBUILD_ENV_BEGIN
from tests.integration.conftest import serve_runs
from tests.pod import Pod, last_event, ok, pod_on, reboot_then_cached_install

pytestmark = pytest.mark.chroot

BUILD = f"/cos-tools/{COS_BUILD_ID}"
BIG = ("kernel-headers.tgz", "toolchain.tar.xz", ".run")


def gets(server, suffix: str) -> list:
    return [r for r in server.requests if r.method == "GET" and r.path.endswith(suffix)]


def big_gets(server) -> list[str]:
    """GETs of large artifacts: headers, toolchain, the .run, prebuilt modules."""
    return [r.path for r in server.requests
            if r.method == "GET" and (r.path.endswith(BIG) or "/nvidia-drivers-" in r.path)]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def cos_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("cos-runs")
    return {v: env_recording_run(out / v, v) for v in (DEFAULT_V, LATEST_V)}


@pytest.fixture
def bucket(tmp_path):
    return Bucket(tmp_path / "bucket")


@pytest.fixture
def server(cos_runs):
    yield from serve_runs(cos_runs)


@pytest.fixture
def node(tmp_path):
    return build_cos_node(tmp_path / "node")


@pytest.fixture
def pod(node, kernel, server, bucket, tmp_path):
    """The pod; the bucket is written and served when the test first runs it."""

    class CosPod(Pod):
        served = False

        def run(self, *args, **kw):
            if not self.served:
                bucket.write()
                self.env["COS_DOWNLOAD_GCS"] = bucket.serve(server)
                self.served = True
            return super().run(*args, **kw)

    return pod_on(node, kernel, server, tmp_path / "pod", pod_class=CosPod)


def tools(node) -> Path:
    return node.root / "var/lib/cos-tools" / COS_BUILD_ID


def installer_log(node) -> str:
    return (node.install_dir / "nvidia-installer.log").read_text()


# --------------------------------------------------------------------------- dry run


@pytest.mark.parametrize("requested, version, alias_file", [
    (None, DEFAULT_V, "gpu_default_version"),
    ("latest", LATEST_V, "gpu_latest_version"),
    ("R550", LATEST_V, "gpu_R550_version"),
    ("R535", DEFAULT_V, "gpu_R535_version"),
])
def test_dry_run_resolves_aliases_and_prints_urls(node, pod, kernel, server, requested, version,
                                                  alias_file):
    before = tree_digest(node.root)
    env = {"NVIDIA_DRIVER_VERSION": requested} if requested else {}
    proc = ok(pod.run("install", "--dry-run", "-o", "json", env=env))
    doc = json.loads(proc.stdout)
    base = f"{server.url}{BUILD}"
    assert doc["dry_run"] is True and doc["kind"] == "fresh"
    assert doc["driver_version"] == version
    assert doc["version_source"] == f"{base}/{alias_file}"
    assert doc["build_id"] == COS_BUILD_ID and doc["board"] == "lakitu"
    assert doc["artifacts_url"] == base
    assert doc["kernel_headers_url"] == f"{base}/kernel-headers.tgz"
    assert doc["toolchain_url"] == f"{base}/toolchain.tar.xz"
    assert doc["driver_url"] == f"{server.url}/tesla/{version}/NVIDIA-Linux-x86_64-{version}.run"
    assert doc["tools_dir"] == f"/root/var/lib/cos-tools/{COS_BUILD_ID}"
    assert [s["name"] for s in doc["steps"]][:7] == [
        "check_gpu_compatibility", "check_module_loading", "check_module_signing",
        "check_loaded_driver",
        "prepare_staging", "take_next_boot", "fetch_artifacts"]
    # Only small metadata was read; nothing written, nothing loaded.
    assert big_gets(server) == []
    assert tree_digest(node.root) == before
    assert kernel.calls() == []
    assert last_event(proc)["event"] == "install_finished"


# --------------------------------------------------------------------------- compile


def test_compile_path_builds_with_the_builds_headers_and_toolchain(node, pod, kernel, server):
    for name in ("kernel-headers.tgz", "toolchain.tar.xz"):
        server.fault(f"{BUILD}/{name}", delay=2.0)
    server.fault(f"/tesla/{DEFAULT_V}/NVIDIA-Linux-x86_64-{DEFAULT_V}.run", delay=2.0)
    proc = ok(pod.run("install"))
    final = last_event(proc)
    assert final["event"] == "install_finished" and final["plan"] == "fresh"
    assert final["driver_version"] == DEFAULT_V

    install = node.install_dir
    for rel in ("bin/nvidia-smi", "drivers/nvidia.ko", "drivers/nvidia-uvm.ko",
                "drivers/nvidia-modeset.ko", "drivers/nvidia-drm.ko",
                "lib64/libnvidia-ml.so.1", f"lib64/libcuda.so.{DEFAULT_V}"):
        assert (install / rel).exists(), rel
    cache = (install / ".cache").read_text()
    assert f"CACHE_BUILD_ID={COS_BUILD_ID}" in cache
    assert f"CACHE_NVIDIA_DRIVER_VERSION={DEFAULT_V}" in cache
    assert "CACHE_FLAVOR=compiled-proprietary" in cache

    # The headers and toolchain are cached on the host, safely extracted.
    t = tools(node)
    src = f"/root/var/lib/cos-tools/{COS_BUILD_ID}/kernel-headers/usr/src/linux-headers-{COS_KERNEL}"
    tc_bin = f"/root/var/lib/cos-tools/{COS_BUILD_ID}/toolchain/bin"
    assert (t / f"kernel-headers/usr/src/linux-headers-{COS_KERNEL}/Makefile").is_file()
    assert os.readlink(t / "toolchain/bin/ld") == f"{TRIPLE}-ld.lld"
    assert not (t / "toolchain/usr/lib64/rustlib").exists()

    # What NVIDIA's Makefile ran with: the extracted headers, the toolchain's CC/CXX, its
    # bin/ first on PATH (so `ld` is the cross linker), and the compiler ran in the sandbox.
    log = (install / "kernel-build.log").read_text()
    assert f"SYSSRC={src} SYSOUT={src} jobs:" in log
    seen = recorded_env(log, KBUILD_ENV_BEGIN)
    assert seen["CC"] == CC and seen["CXX"] == CXX
    assert seen["PATH"].split(":")[0] == tc_bin  # no kmod stand-ins: nothing loads here
    assert "--no-kernel-module" in installer_log(node)  # user space only
    assert seen["SYSROOT"] == f"/root/var/lib/cos-tools/{COS_BUILD_ID}/toolchain/usr/{TRIPLE}"
    assert seen["IGNORE_MISSING_MODULE_SYMVERS"] == "1"
    assert f"{CC} (fake COS toolchain)" in log
    assert f"{tc_bin}/ld" in log and "LLD 17.0.0 (fake COS toolchain" in log

    # Loaded in dependency order from the install dir.
    assert {"nvidia", "nvidia_uvm"} <= set(kernel.loaded())  # what a node gets
    assert kernel.loaded()["nvidia"].version == DEFAULT_V

    # The three big artifacts were fetched once each, in parallel (each answer is
    # delayed 2 s: one after the other would take 6 s).
    for name in ("kernel-headers.tgz", "toolchain.tar.xz", f"NVIDIA-Linux-x86_64-{DEFAULT_V}.run"):
        assert len(gets(server, name)) == 1, name
    status = json.loads((install / "status.json").read_text())
    fetch = next(s for s in status["steps"] if s["name"] == "fetch_artifacts")
    assert fetch["duration_s"] < 5.0, fetch
    # The host's ld cache knows the install dir (host view).
    assert (node.root / "etc/ld.so.conf.d/nvidia.conf").read_text() == f"{INSTALL_HOST}/lib64\n"


def test_cache_hit_after_reboot_and_tools_reused(node, pod, kernel, server):
    ok(pod.run("install"))
    _, new = reboot_then_cached_install(pod, kernel, server)
    # Only the alias is read again: no artifact is downloaded.
    assert [r.path for r in new] == [f"{BUILD}/gpu_default_version"]
    assert kernel.loaded()["nvidia"].version == DEFAULT_V
    assert {"nvidia", "nvidia_uvm"} <= set(kernel.loaded())  # what a node gets

    # A version change rebuilds, reusing the cached toolchain and headers.
    before = len(server.requests)
    proc = ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": "latest"}))
    assert last_event(proc)["plan"] == "fresh"
    fetched = [r.path for r in server.requests[before:] if r.method == "GET"]
    assert not [p for p in fetched if p.endswith(("kernel-headers.tgz", "toolchain.tar.xz"))]
    assert kernel.loaded()["nvidia"].version == LATEST_V


def test_preload_caches_tools_without_gpu_or_install(node, pod, kernel, server):
    import shutil

    shutil.rmtree(kernel.sys_dir / "bus/pci/devices")  # a node image builder: no GPU
    (kernel.sys_dir / "bus/pci/devices").mkdir()
    proc = ok(pod.run("install", env={"PRELOAD": "1"}))
    final = last_event(proc)
    assert final["plan"] == "preload"
    assert "preload done" in final["message"]
    assert (tools(node) / "toolchain/bin" / CC).is_file()
    assert (tools(node) / f"kernel-headers/usr/src/linux-headers-{COS_KERNEL}/Makefile").is_file()
    assert [p.name for p in node.install_dir.iterdir() if p.name != "status.json"] == []
    assert gets(server, ".run") == [] and kernel.calls() == []

    # The install that follows fetches only the driver.
    kernel.add_gpu()
    before = len(server.requests)
    ok(pod.run("install"))
    fetched = [r.path for r in server.requests[before:] if r.method == "GET"]
    assert not [p for p in fetched if p.endswith(("kernel-headers.tgz", "toolchain.tar.xz"))]
    assert [p for p in fetched if p.endswith(".run")]


# --------------------------------------------------------------------------- prebuilt


def test_prebuilt_signed_modules_on_an_enforcing_node(node, pod, kernel, server, bucket):
    bucket.prebuilt_versions = (LATEST_V,)
    kernel.set_cmdline("module.sig_enforce=1 loadpin.exclude=kernel-module "
                       "modules-load=loadpin_trigger")
    proc = ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": "latest"}))
    final = last_event(proc)
    assert final["plan"] == "fresh" and final["driver_version"] == LATEST_V

    install = node.install_dir
    cache = (install / ".cache").read_text()
    assert "CACHE_FLAVOR=prebuilt-open" in cache and f"CACHE_BUILD_ID={COS_BUILD_ID}" in cache
    for ko in ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm"):
        data = (install / f"drivers/{ko}.ko").read_bytes()
        assert data.endswith(b"~Module signature appended~\n") and b"license=Dual MIT/GPL" in data
    assert (install / f"firmware/nvidia/{LATEST_V}/gsp_ga10x.bin").read_bytes().startswith(
        b"prebuilt-firmware")
    assert (install / "bin/nvidia-smi").exists()
    # User space only: no kernel build, no headers, no toolchain.
    log = installer_log(node)
    assert "--no-kernel-module" in log and "--kernel-source-path" not in log
    assert gets(server, "kernel-headers.tgz") == [] and gets(server, "toolchain.tar.xz") == []
    assert not tools(node).exists()
    assert kernel.loaded()["nvidia"].version == LATEST_V


def test_signature_enforcement_without_prebuilt_exit_10_before_big_downloads(
        node, pod, kernel, server):
    kernel.set_sig_enforce(True)
    before = tree_digest(node.install_dir)
    proc = pod.run("install")
    assert proc.returncode == 10, proc.stderr[-3000:]
    final = last_event(proc)
    assert final["error_class"] == "secure_boot"
    assert COS_BUILD_ID in final["error"] and f"nvidia-drivers-{DEFAULT_V}.tgz" in final["error"]
    assert "never edits boot config" in final["hint"]
    # The server's log: the alias, toolchain metadata and HEAD probes (prebuilt modules,
    # then the signatures of the precompiled driver); no big artifact.
    assert big_gets(server) == []
    assert [(r.method, r.path.rsplit("/", 1)[-1]) for r in server.requests
            if "/nvidia-drivers-" in r.path] == [
        ("HEAD", f"nvidia-drivers-{DEFAULT_V}.tgz"),
        ("HEAD", f"nvidia-drivers-{DEFAULT_V}-signature.tar.gz")]
    assert not tools(node).exists()
    after = tree_digest(node.install_dir)
    assert {k for k in after if k != "status.json"} == {k for k in before if k != "status.json"}
    assert kernel.calls("insmod") == []


# --------------------------------------------------------------------------- precompiled-signed


@pytest.fixture(scope="session")
def cos_custom_run(tmp_path_factory):
    return custom_run(tmp_path_factory.mktemp("cos-custom"), DEFAULT_V, COS_KERNEL)


def test_precompiled_signed_on_an_enforcing_node_for_a_v100(node, pod, kernel, server, bucket,
                                                            cos_custom_run):
    kernel.add_gpu(device="0x1db4")  # Tesla V100: proprietary modules only
    kernel.set_sig_enforce(True)
    bucket.prebuilt_versions = (DEFAULT_V,)  # open modules: unusable for a V100
    bucket.custom_runs = {DEFAULT_V: cos_custom_run}
    bucket.signature_versions = (DEFAULT_V,)
    proc = ok(pod.run("install"))
    final = last_event(proc)
    assert final["plan"] == "fresh" and final["driver_version"] == DEFAULT_V

    install = node.install_dir
    cache = (install / ".cache").read_text()
    assert "CACHE_FLAVOR=precompiled-signed" in cache
    assert f"CACHE_BUILD_ID={COS_BUILD_ID}" in cache
    magic = b"~Module signature appended~\n"
    google_signed = signed_modules(DEFAULT_V, COS_KERNEL)
    for ko in SIGNED_MODULES:
        data = (install / "drivers" / ko).read_bytes()
        assert data.endswith(magic) and fake_pkcs7(google_signed[ko]) in data
        assert b"license=NVIDIA\0" in data and data.count(magic) == 1  # signed by the trailer
    nvidia = (install / "drivers/nvidia.ko").read_bytes()
    assert b"interface=nv-linux.o" in nvidia and b"core=nv-kernel.o_binary" in nvidia
    assert b"core=nv-modeset-kernel.o_binary" in (install / "drivers/nvidia-modeset.ko").read_bytes()
    assert (install / "bin/nvidia-smi").exists()
    log = installer_log(node)
    assert "--no-kernel-module" in log and "--kernel-source-path" not in log
    # The custom .run, not NVIDIA's public one; the prebuilt open modules not fetched.
    assert gets(server, f"NVIDIA-Linux-x86_64-{DEFAULT_V}-custom.run")
    assert gets(server, f"/tesla/{DEFAULT_V}/NVIDIA-Linux-x86_64-{DEFAULT_V}.run") == []
    assert gets(server, f"nvidia-drivers-{DEFAULT_V}.tgz") == []
    loaded = kernel.loaded()
    assert loaded["nvidia"].version == DEFAULT_V
    assert {"nvidia", "nvidia_uvm"} <= set(loaded)
    # Tainted O and P (out of tree, proprietary) but not E: taken as signed.
    lines = (kernel.proc_dir / "modules").read_text().splitlines()
    assert any(ln.startswith("nvidia ") and ln.endswith("(PO)") for ln in lines), lines

    # A reboot: a cache hit of that flavour, which loads the signed modules again.
    reboot_then_cached_install(pod, kernel, server)
    assert kernel.loaded()["nvidia"].version == DEFAULT_V


def test_staged_on_google_precompiled_modules_readiness_names_the_running_module_type(
        node, pod, kernel, server, bucket, cos_custom_run, tmp_path):
    """Issue 32 item 1: a V100 running Google's signed precompiled (proprietary) modules,
    another version staged for the next boot: driver-ready describes the running driver,
    whose modules are proprietary (the cache's "precompiled-signed" is no module type)."""
    kernel.add_gpu(device="0x1db4")  # Tesla V100: proprietary modules only
    kernel.set_sig_enforce(True)
    bucket.prebuilt_versions = (DEFAULT_V,)  # open modules: unusable for a V100
    bucket.custom_runs = {DEFAULT_V: cos_custom_run,
                          LATEST_V: custom_run(tmp_path / "custom-latest", LATEST_V, COS_KERNEL)}
    bucket.signature_versions = (DEFAULT_V, LATEST_V)
    ok(pod.run("install"))
    kernel.hold("nvidia")
    proc = ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": "latest",
                                      "WHEN_IN_USE": "stage"}))
    assert last_event(proc)["plan"] == "staged"
    ready = dict(line.split("=", 1) for line in
                 (node.root / "run/nvidia/validations/driver-ready").read_text().splitlines())
    assert ready["NVIDIA_DRIVER_VERSION"] == DEFAULT_V
    assert ready["PENDING_DRIVER_VERSION"] == LATEST_V
    assert ready["NVIDIA_KERNEL_MODULE_TYPE"] == "proprietary"


def test_precompiled_without_signatures_is_exit_10_before_big_downloads(
        node, pod, kernel, server, bucket, cos_custom_run):
    kernel.add_gpu(device="0x1db4")
    kernel.set_sig_enforce(True)
    bucket.custom_runs = {DEFAULT_V: cos_custom_run}
    proc = pod.run("install")
    assert proc.returncode == 10, proc.stderr[-3000:]
    final = last_event(proc)
    assert final["error_class"] == "secure_boot"
    assert f"nvidia-drivers-{DEFAULT_V}-signature.tar.gz" in final["error"]
    assert big_gets(server) == [] and gets(server, "-custom.run") == []
    assert kernel.calls("insmod") == []


def test_precompiled_with_tampered_signatures_is_exit_6(node, pod, kernel, server, bucket,
                                                        cos_custom_run):
    kernel.add_gpu(device="0x1db4")
    kernel.set_sig_enforce(True)
    bucket.custom_runs = {DEFAULT_V: cos_custom_run}
    bucket.signature_versions = (DEFAULT_V,)
    bucket.evil_signatures = "dotdot"
    before = tree_digest(node.install_dir)
    proc = pod.run("install")
    assert proc.returncode == 6, proc.stderr[-3000:]
    final = last_event(proc)
    assert final["error_class"] == "integrity" and "signature" in final["error"]
    assert not Path("/tmp/cos-evil-signature").exists()
    assert not (node.root / "tmp/cos-evil-signature").exists()
    after = tree_digest(node.install_dir)
    assert {k for k in after if k != "status.json"} == {k for k in before if k != "status.json"}
    assert kernel.calls("insmod") == []


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize("evil", ["dotdot", "absolute", "symlink_out", "hardlink_out", "device"])
def test_malicious_kernel_headers_exit_6_nothing_outside(node, pod, kernel, server, bucket, evil):
    bucket.evil_headers = evil
    proc = pod.run("install")
    assert proc.returncode == 6, proc.stderr[-3000:]
    final = last_event(proc)
    assert final["error_class"] == "integrity"
    assert "unsafe archive kernel-headers.tgz" in final["error"]
    for p in EVIL_PATHS:
        assert not (node.root / p.lstrip("/")).exists(), p
        assert not Path(p).exists(), p
    t = tools(node)
    assert not (t / "kernel-headers").exists()
    assert not list(t.glob(".kernel-headers*"))
    assert not (node.install_dir / ".cache").exists()
    assert not (node.install_dir / "drivers").exists()
    assert kernel.calls("insmod") == []


def test_missing_artifact_exit_5_with_url(node, pod, server, bucket):
    pod.run("install", "--dry-run")  # writes and serves the bucket
    server.remove(f"{BUILD}/kernel-headers.tgz")
    proc = pod.run("install")
    assert proc.returncode == 5, proc.stderr[-3000:]
    final = last_event(proc)
    url = f"{server.url}{BUILD}/kernel-headers.tgz"
    assert final["error_class"] == "download" and url in final["error"]
    assert final["url"] == url
    assert not (node.install_dir / ".cache").exists()


def test_missing_alias_exit_5_names_build_and_alias(node, pod, server):
    proc = pod.run("install", env={"NVIDIA_DRIVER_VERSION": "R470"})
    assert proc.returncode == 5, proc.stderr[-3000:]
    final = last_event(proc)
    assert COS_BUILD_ID in final["error"] and "R470" in final["error"]
    assert final["url"] == f"{server.url}{BUILD}/gpu_R470_version"


@pytest.mark.parametrize("build_line", ["", "BUILD_ID=not-a-build\n"])
def test_missing_or_malformed_build_id_exit_3(node, pod, server, build_line):
    path = node.root / "etc/os-release"
    text = "".join(ln + "\n" for ln in path.read_text().splitlines()
                   if not ln.startswith("BUILD_ID="))
    path.write_text(text + build_line)
    proc = pod.run("install")
    assert proc.returncode == 3, proc.stderr[-3000:]
    final = last_event(proc)
    assert final["error_class"] == "unsupported_host"
    assert "BUILD_ID" in final["error"] and "/etc/os-release" in final["error"]
    assert server.requests == []


# --------------------------------------------------------------------------- busy nodes


def test_in_use_driver_on_cos_stages_the_new_one_for_the_next_boot(node, pod, kernel, server):
    """Issue 23 on the COS flow (the same fresh_plan): the build waits in .next-boot while
    the running driver is held; after the reboot it installs with no big download."""
    ok(pod.run("install"))
    kernel.hold("nvidia")
    proc = ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": "latest",
                                      "WHEN_IN_USE": "stage"}))
    final = last_event(proc)
    assert final["plan"] == "staged" and final["staged_driver_version"] == LATEST_V
    assert final["driver_version"] == DEFAULT_V == kernel.loaded()["nvidia"].version
    assert f"CACHE_NVIDIA_DRIVER_VERSION={LATEST_V}" in (
        node.install_dir / ".next-boot/.cache").read_text()
    assert f"CACHE_BUILD_ID={COS_BUILD_ID}" in (
        node.install_dir / ".next-boot/.cache").read_text()

    kernel.unhold("nvidia")
    kernel.unload_all()  # the reboot
    big_before = len(big_gets(server))
    proc = ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": "latest",
                                      "WHEN_IN_USE": "stage"}))
    assert last_event(proc)["plan"] == "fresh"
    assert big_gets(server)[big_before:] == []  # no toolchain, headers or .run again
    assert kernel.loaded()["nvidia"].version == LATEST_V
    assert not (node.install_dir / ".next-boot").exists()
