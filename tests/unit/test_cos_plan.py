"""The COS distro's plans (compile, prebuilt, cached, preload) and their early steps,
against a fixture COS node, a fake kernel and a file:// bucket (no root, no network)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from installer.base.errors import DownloadError, ExitCode, IntegrityError, SecureBootError
from installer.context import Context
from installer.detect import context, probe
from installer.distros.cos.choice import decide_modules
from installer.distros.cos.flow import CosFlow
from installer.distros.cos.host import Cos
from installer.distros.cos.options import CosOptions
from installer.distros.flows import for_host
from installer.kmod.kernel import KernelState
from installer.plan import run_step
from installer.records import cache
from installer.records.cache import CacheKey, ModuleSource
from installer.records.results import HeadersReady, ToolchainReady
from installer.settings import Settings, validate
from tests.cosbucket import CC, CXX, DEFAULT_V, LATEST_V, TRIPLE, Bucket
from tests.fixtures.kernel import FakeKernel
from tests.fixtures.node import COS_BUILD_ID, COS_KERNEL, build_cos_node
from tests.fixtures.plans import ACTIVATE_STAGED, LOAD_CACHED

COMPILE_STEPS = [
    "check_gpu_compatibility", "check_module_loading", "check_module_signing",
        "check_loaded_driver", "prepare_staging",
    "take_next_boot", "fetch_artifacts",
    "prepare_kernel_headers", "prepare_toolchain", "extract_driver", "build_driver",
    *ACTIVATE_STAGED,
]
PREBUILT_STEPS = [
    "check_gpu_compatibility", "check_module_loading", "check_module_signing",
        "check_loaded_driver", "prepare_staging",
    "take_next_boot", "fetch_artifacts",
    "unpack_prebuilt", "extract_driver", "build_driver", "place_prebuilt",
    *ACTIVATE_STAGED,
]
CACHED_STEPS = ["check_gpu_compatibility", "check_module_loading", "drop_next_boot", *LOAD_CACHED]


class Env:
    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.node = build_cos_node(tmp_path / "node")
        self.kernel = FakeKernel(tmp_path / "kernel", COS_KERNEL)
        self.kernel.add_gpu()  # an L4: open modules are fine
        self.bucket = Bucket(tmp_path / "bucket")
        self.tools_dir = tmp_path / "tools"
        self.tesla = tmp_path / "tesla"

    def ctx(self, *, artifacts_url: str | None = None, preload: bool = False,
            **settings) -> Context:
        self.bucket.write()
        cos = CosOptions(artifacts_url=artifacts_url or self.bucket.file_url(),
                         toolchain_dir=self.tools_dir, preload=preload)
        s = validate(Settings(
            host_root=self.node.root,
            install_dir=self.node.install_dir,
            distro_options=(cos,),
            # the two are refused together
            **({} if "driver_url" in settings else {"driver_base_url": f"file://{self.tesla}"}),
            **settings,
        ))
        kernel = KernelState(self.kernel.proc_dir, self.kernel.sys_dir, self.kernel.dev_dir)
        return probe(context(s, kernel))


@pytest.fixture
def env(tmp_path):
    return Env(tmp_path)


def names(plan) -> list[str]:
    return [s.name for s in plan.steps]


def step(plan, name):
    return next(s for s in plan.steps if s.name == name)


def test_registry_and_detection(env):
    ctx = env.ctx()
    assert ctx.host_info.build_id == COS_BUILD_ID and ctx.host_info.board == "lakitu"
    assert for_host(ctx.host_info).distro is Cos


def test_compile_plan(env):
    ctx = env.ctx()
    plan = CosFlow().plan(probe(ctx))
    assert plan.kind == "fresh"
    assert names(plan) == COMPILE_STEPS
    base = f"file://{env.bucket.root}/{COS_BUILD_ID}"
    s = plan.summary
    assert s["driver_version"] == DEFAULT_V and s["version_alias"] == "default"
    assert s["version_source"] == f"{base}/gpu_default_version"
    assert s["module_source"] == "compiled"
    assert s["artifacts_url"] == base
    assert s["driver_url"] == f"file://{env.tesla}/{DEFAULT_V}/NVIDIA-Linux-x86_64-{DEFAULT_V}.run"
    assert s["kernel_headers_url"] == f"{base}/kernel-headers.tgz"
    assert s["toolchain_url"] == f"{base}/toolchain.tar.xz"
    assert s["toolchain_env"] == {"CC": CC, "CXX": CXX}
    assert s["prebuilt_modules_url"] == f"{base}/nvidia-drivers-{DEFAULT_V}.tgz"
    assert s["prebuilt_modules_used"] is False and s["signatures_enforced"] is False
    assert s["tools_dir"] == str(env.tools_dir / COS_BUILD_ID)
    fetch = step(plan, "fetch_artifacts").detail
    for url in (s["driver_url"], s["kernel_headers_url"], s["toolchain_url"]):
        assert url in fetch
    # Planning wrote nothing (dry-run safety).
    assert not env.tools_dir.exists()
    assert not (env.node.install_dir / ".staging").exists()
    json.dumps(plan.describe())  # what --dry-run prints is JSON


def test_dry_run_texts_are_the_argv_the_steps_run(env):
    from installer.driver import module_build
    from installer.driver.nvidia_options import installer_args
    from installer.jail import cgroup_memory, cpus
    from installer.kmod import devnodes
    from installer.kmod.headers import KernelTree
    from installer.kmod.kernel import module_name
    from installer.kmod.modules import COMPUTE_MODULES

    loaded = tuple(module_name(f) for f in COMPUTE_MODULES)  # what load_modules loads
    env.kernel.add_gpu("0000:00:04.0")
    env.kernel.add_gpu("0000:00:05.0")
    plan = CosFlow().plan(env.ctx())
    assert step(plan, "device_nodes").detail == (
        "nvidia-modprobe " + " ".join(devnodes.modprobe_invocations([0, 1], loaded)[0]) + "; "
        "nvidia-modprobe -c0 -u; /dev/char/<major>:<minor> links")
    # nvidia-modeset is not loaded without --display-modules: no -m (nvidia-modprobe would
    # try to load it, and exit 1 where it cannot: tests/data/gpu-node).
    assert "-c255 -c0 -c1;" in step(plan, "device_nodes").detail
    assert step(plan, "load_modules").detail.startswith("insmod nvidia, nvidia-uvm from ")
    jobs = cgroup_memory.jobs_for(cpus.usable_cpus(), cgroup_memory.memory_limit())
    make = module_build.make_argv("/tmp/nvidia-driver-installer/extract/kernel",
                                  KernelTree(Path("<kernel-source>"), Path("<kernel-output>")), jobs)
    argv = installer_args(version=DEFAULT_V)
    assert step(plan, "build_driver").detail.startswith(
        " ".join(make) + "; then " + " ".join(argv) + " (NVIDIA ")


def test_prebuilt_plan_is_preferred(env):
    env.bucket.prebuilt_versions = (LATEST_V,)
    plan = CosFlow().plan(env.ctx(driver_version="latest"))
    assert names(plan) == PREBUILT_STEPS
    s = plan.summary
    assert s["driver_version"] == LATEST_V and s["module_source"] == "prebuilt"
    assert s["prebuilt_modules_used"] is True
    assert "toolchain_url" not in s  # no toolchain needed
    fetch = step(plan, "fetch_artifacts").detail
    assert f"nvidia-drivers-{LATEST_V}.tgz" in fetch and "toolchain" not in fetch
    assert "kernel-headers" not in fetch


def test_proprietary_request_skips_prebuilt_open_modules(env):
    env.bucket.prebuilt_versions = (LATEST_V,)
    plan = CosFlow().plan(env.ctx(driver_version="latest", kernel_module_type="proprietary"))
    assert names(plan) == COMPILE_STEPS
    assert plan.summary["module_source"] == "compiled"
    assert any("proprietary" in n for n in plan.summary["kernel_module_notes"])


def test_pre_turing_gpu_skips_prebuilt_open_modules(env):
    for dev in (env.kernel.sys_dir / "bus/pci/devices").iterdir():
        (dev / "device").write_text("0x1db1\n")  # V100
    env.bucket.prebuilt_versions = (LATEST_V,)
    plan = CosFlow().plan(env.ctx(driver_version="latest"))
    assert names(plan) == COMPILE_STEPS
    assert any("V100" in n for n in plan.summary["kernel_module_notes"])


def test_branch_alias_and_explicit_version(env):
    plan = CosFlow().plan(env.ctx(driver_version="R550"))
    assert plan.summary["driver_version"] == LATEST_V
    assert plan.summary["version_source"].endswith("/gpu_R550_version")
    plan = CosFlow().plan(env.ctx(driver_version="535.104.05"))
    assert plan.summary["driver_version"] == "535.104.05"
    assert plan.summary["version_source"] is None


def test_missing_alias_is_exit_5_with_url(env):
    with pytest.raises(DownloadError) as err:
        CosFlow().plan(env.ctx(driver_version="R470"))
    assert err.value.exit_code == 5
    assert err.value.context["url"].endswith(f"{COS_BUILD_ID}/gpu_R470_version")
    assert COS_BUILD_ID in err.value.message and "R470" in err.value.message


def test_no_toolchain_env_uses_cros_defaults_and_toolchain_url(env):
    env.bucket.toolchain_env = None
    env.bucket.toolchain_via_url = "../toolchain-elsewhere.tar.xz"
    s = CosFlow().plan(env.ctx()).summary
    assert s["toolchain_env"] == {"CC": "x86_64-cros-linux-gnu-gcc",
                                  "CXX": "x86_64-cros-linux-gnu-g++"}
    assert s["toolchain_url"] == f"file://{env.bucket.root}/toolchain-elsewhere.tar.xz"


def _install_files(root: Path, version: str):
    for rel, data in {"drivers/nvidia.ko": b"ko", "bin/nvidia-smi": b"smi",
                      f"lib64/libnvidia-ml.so.{version}": b"nvml"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "lib64/libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{version}")


def test_cached_plan_needs_build_and_version(env):
    ctx = env.ctx()
    _install_files(env.node.install_dir, DEFAULT_V)
    cache.write(ctx.install.cache_file, CacheKey(DEFAULT_V, build_id=COS_BUILD_ID,
                                                 source=ModuleSource.PREBUILT,
                                                 module_type="open"),
                ctx.install.root, "test")
    text = ctx.install.cache_file.read_text()
    assert f"CACHE_BUILD_ID={COS_BUILD_ID}" in text and "CACHE_FLAVOR=prebuilt-open" in text
    plan = CosFlow().plan(probe(ctx))
    assert plan.kind == "cached" and names(plan) == CACHED_STEPS
    assert plan.summary["module_source"] == "prebuilt"
    assert plan.kernel_module_type == "open"
    # Another version: fresh.
    assert CosFlow().plan(env.ctx(driver_version="latest")).kind == "fresh"
    # --force: fresh.
    assert CosFlow().plan(env.ctx(force=True)).kind == "fresh"


def test_a_cos_cache_hit_with_an_alias_reads_the_record_once(env, monkeypatch):
    """The .cache record is read once, by the probe before planning: resolving the alias
    offline, the cache check and the cached plan all read that one record (three reads on
    main), and planning reads no node state of its own."""
    ctx = env.ctx()
    _install_files(env.node.install_dir, DEFAULT_V)
    cache.write(ctx.install.cache_file, CacheKey(DEFAULT_V, build_id=COS_BUILD_ID,
                                                 source=ModuleSource.PREBUILT,
                                                 module_type="open"),
                ctx.install.root, "test")
    reads = []
    real_read = cache.read
    monkeypatch.setattr(cache, "read", lambda path: reads.append(path) or real_read(path))
    ctx = env.ctx(driver_version="default")
    assert reads == [ctx.install.cache_file]
    plan = CosFlow().plan(ctx)
    assert plan.kind == "cached" and plan.summary["driver_version"] == DEFAULT_V
    assert reads == [ctx.install.cache_file]


def test_gke_v1_cache_record_is_recognised(env):
    ctx = env.ctx()
    _install_files(env.node.install_dir, DEFAULT_V)
    ctx.install.cache_file.write_text(
        f"CACHE_BUILD_ID={COS_BUILD_ID}\nCACHE_NVIDIA_DRIVER_VERSION={DEFAULT_V}\n")
    assert CosFlow().plan(probe(ctx)).kind == "cached"
    ctx.install.cache_file.write_text(
        f"CACHE_BUILD_ID=17800.1.1\nCACHE_NVIDIA_DRIVER_VERSION={DEFAULT_V}\n")
    assert CosFlow().plan(probe(ctx)).kind == "fresh"


def test_alias_falls_back_to_cache_when_artifacts_unreachable(env):
    ctx = env.ctx()
    _install_files(env.node.install_dir, DEFAULT_V)
    cache.write(ctx.install.cache_file, CacheKey(DEFAULT_V, build_id=COS_BUILD_ID),
                ctx.install.root, "test")
    # Nothing listens on port 9: connection refused, fast.
    ctx = env.ctx(artifacts_url="https://127.0.0.1:9/{build_id}")
    plan = CosFlow().plan(probe(ctx))
    assert plan.kind == "cached" and plan.summary["driver_version"] == DEFAULT_V
    assert "cached install" in plan.summary["version_source"]


def test_unreachable_artifacts_without_cache_is_exit_5(env, monkeypatch):
    import installer.distros.cos.versions as cos_mod
    from installer.net.retry import RetryPolicy

    ctx = env.ctx(artifacts_url="https://127.0.0.1:9/{build_id}")
    object.__setattr__(ctx.settings, "download_retries", 1)
    monkeypatch.setattr(cos_mod, "quick_policy", lambda: RetryPolicy(1, 0, 0, 5, 2, 2))
    with pytest.raises(DownloadError) as err:
        CosFlow().plan(probe(ctx))
    assert err.value.exit_code == 5 and "127.0.0.1:9" in err.value.message


# --------------------------------------------------------------------------- signing


def test_enforced_signatures_without_prebuilt_stop_first_with_exit_10(env):
    env.kernel.set_cmdline("module.sig_enforce=1")
    ctx = env.ctx()
    plan = CosFlow().plan(probe(ctx))
    assert plan.summary["signatures_enforced"] is True and "blocked" in plan.summary
    plan.steps[0].run(ctx)  # the GPU check passes
    plan.steps[1].run(ctx)  # module loading is on
    sign = plan.steps[2]
    assert sign.name == "check_module_signing"
    with pytest.raises(SecureBootError) as err:
        sign.run(ctx)
    exc = err.value
    assert exc.exit_code == ExitCode.SECURE_BOOT == 10
    assert COS_BUILD_ID in exc.message and DEFAULT_V in exc.message
    assert exc.message.startswith("this node only loads signed kernel modules (module.sig_enforce")
    assert exc.context["url"].endswith(f"nvidia-drivers-{DEFAULT_V}.tgz")
    assert "never edits boot config" in exc.hint


def test_enforced_signatures_with_prebuilt_pass(env):
    env.kernel.set_lockdown("integrity")
    env.bucket.prebuilt_versions = (DEFAULT_V,)
    ctx = env.ctx()
    plan = CosFlow().plan(probe(ctx))
    assert plan.summary["module_source"] == "prebuilt" and "blocked" not in plan.summary
    checked = plan.steps[0].run(ctx)
    plan.steps[1].run(ctx)  # no error
    assert checked.module_type == "open"


def test_decide_modules_matrix():
    from installer.host import gpus

    l4 = gpus.PciGpu("0000:00:04.0", "0x27b8", "0x030200", model=gpus.MODELS["0x27b8"])
    v100 = gpus.PciGpu("0000:00:05.0", "0x1db1", "0x030200", model=gpus.MODELS["0x1db1"])
    d = decide_modules([l4], "535.183.01", "auto", True)
    assert d.use_prebuilt
    d = decide_modules([l4], "535.183.01", "auto", False)
    assert not d.use_prebuilt and d.compiled_type == "proprietary"
    d = decide_modules([l4], "570.133.20", "auto", False)
    assert d.compiled_type == "open"
    d = decide_modules([v100], "570.133.20", "auto", True)
    assert not d.use_prebuilt and d.compiled_type == "proprietary"
    assert d.notes
    d = decide_modules([], "535.183.01", "open", False)
    assert d.compiled_type == "open"
    d = decide_modules([l4], "535.183.01", "proprietary", True)
    assert not d.use_prebuilt


def test_default_alias_falls_back_to_a_branch_the_gpu_supports(env):
    for dev in (env.kernel.sys_dir / "bus/pci/devices").iterdir():
        (dev / "device").write_text("0x102d\n")  # K80: R470 at most
    env.bucket.aliases["R470"] = "470.256.02"
    plan = CosFlow().plan(env.ctx())
    s = plan.summary
    assert s["driver_version"] == "470.256.02" and s["version_alias"] == "R470"
    assert "K80" in s["version_note"] and s["requested_version"] == "default"
    # An explicit branch is never changed: the GPU check refuses it (exit 2).
    ctx = env.ctx(driver_version="R535")
    plan = CosFlow().plan(probe(ctx))
    assert plan.summary["driver_version"] == DEFAULT_V
    from installer.base.errors import UsageError
    with pytest.raises(UsageError, match="too new"):
        plan.steps[0].run(ctx)


# --------------------------------------------------------------------------- preload


def test_preload_plan_and_run(env):
    ctx = env.ctx(preload=True)
    plan = CosFlow().plan(probe(ctx))
    assert plan.kind == "preload"
    assert names(plan) == ["fetch_artifacts", "prepare_kernel_headers", "prepare_toolchain",
                           "preload_finished"]
    assert plan.summary["already_cached"] is False and plan.driver_version is None
    for s in plan.steps:
        run_step(s, ctx)
    tools = env.tools_dir / COS_BUILD_ID
    headers = tools / f"kernel-headers/usr/src/linux-headers-{COS_KERNEL}"
    assert (headers / "Makefile").is_file()
    kernel_tree = ctx.results.need(HeadersReady).tree
    assert kernel_tree.source == kernel_tree.output == headers
    tc = tools / "toolchain"
    assert os.access(tc / f"bin/{CC}", os.X_OK)
    assert os.readlink(tc / "bin/ld") == f"{TRIPLE}-ld.lld"
    assert not (tc / "usr/lib64/rustlib").exists()
    assert not list((tc / "usr/lib64").glob("librustc*"))
    assert not (tools / ".downloads/kernel-headers.tgz").exists()  # archives removed
    toolchain = ctx.results.need(ToolchainReady).toolchain
    env_ = toolchain.env
    assert env_["CC"] == CC and env_["CXX"] == CXX
    assert env_["PATH"].split(":")[0] == str(tc / "bin")
    assert env_["SYSROOT"] == str(tc / f"usr/{TRIPLE}")
    assert toolchain.binds == ((str(tools), str(tools)),)
    marker = json.loads((tc / ".nvidia-driver-installer.json").read_text())
    assert marker["source_url"].endswith("/toolchain.tar.xz") and len(marker["sha256"]) == 64
    # Nothing was installed; the install dir is untouched.
    assert not any(env.node.install_dir.iterdir())

    # Second preload: everything is cached, nothing to fetch.
    plan2 = CosFlow().plan(env.ctx(preload=True))
    assert plan2.summary["already_cached"] is True
    assert names(plan2) == ["prepare_kernel_headers", "prepare_toolchain", "preload_finished"]
    # And the compile plan reuses them: only the .run is fetched.
    plan3 = CosFlow().plan(env.ctx())
    fetch = step(plan3, "fetch_artifacts").detail
    assert "toolchain" not in fetch and "kernel-headers" not in fetch


def test_preload_prunes_other_builds_it_made(env):
    old = env.tools_dir / "17800.1.1"
    (old / "toolchain").mkdir(parents=True)
    (old / "toolchain/.nvidia-driver-installer.json").write_text("{}")
    foreign = env.tools_dir / "17700.9.9"
    foreign.mkdir()
    (foreign / "keep").write_text("not ours")
    ctx = env.ctx(preload=True)
    for s in CosFlow().plan(probe(ctx)).steps:
        run_step(s, ctx)
    assert not old.exists() and foreign.exists()


def test_malicious_headers_refused_during_preload(env, tmp_path):
    env.bucket.evil_headers = "symlink_out"
    ctx = env.ctx(preload=True)
    plan = CosFlow().plan(probe(ctx))
    run_step(step(plan, "fetch_artifacts"), ctx)
    with pytest.raises(IntegrityError, match="symlink pointing outside") as err:
        step(plan, "prepare_kernel_headers").run(ctx)
    assert err.value.exit_code == 6
    headers = env.tools_dir / COS_BUILD_ID / "kernel-headers"
    assert not headers.exists()
    assert not list((env.tools_dir / COS_BUILD_ID).glob(".kernel-headers*"))


@pytest.mark.parametrize("output", ["json", "text"])
def test_dry_run_on_the_cli_prints_versions_urls_and_plan(env, capsys, monkeypatch, output):
    """`install --dry-run` end to end in-process: nothing written, plan on stdout (-o json:
    the document for tools; text: the steps as a numbered list)."""
    from installer.cli import main

    env.bucket.write()
    argv = ["install", "--dry-run", "-o", output, "--host-root", str(env.node.root),
            "--install-dir", str(env.node.install_dir), "--toolchain-dir", str(env.tools_dir),
            "--cos-artifacts-url", env.bucket.file_url(),
            "--driver-base-url", f"file://{env.tesla}", "--log-format", "json"]
    env.kernel.activate(monkeypatch)
    monkeypatch.setenv("KERNEL_RELEASE", COS_KERNEL)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert not env.tools_dir.exists()
    assert not any(env.node.install_dir.iterdir())
    if output == "text":
        lines = out.splitlines()
        assert lines[0].startswith("dry run: fresh plan for ") and f"kernel {COS_KERNEL}" in lines[0]
        assert f"driver_version: {DEFAULT_V}" in lines
        numbered = [ln.split(".", 1)[1].split(":")[0].strip() for ln in lines[lines.index("steps:") + 1:]]
        assert numbered == COMPILE_STEPS
        return
    doc = json.loads(out)
    assert doc["dry_run"] is True and doc["kind"] == "fresh"
    assert doc["driver_version"] == DEFAULT_V and doc["build_id"] == COS_BUILD_ID
    assert doc["kernel_headers_url"].endswith("/kernel-headers.tgz")
    assert [s["name"] for s in doc["steps"]] == COMPILE_STEPS


def test_driver_url_names_the_version(env):
    url = "https://mirror.example/nvidia/NVIDIA-Linux-x86_64-550.90.07.run"
    plan = CosFlow().plan(env.ctx(driver_url=url))
    assert plan.summary["driver_version"] == "550.90.07"
    assert plan.summary["driver_url"] == url
    # An explicit version or alias still wins over the URL's name.
    plan = CosFlow().plan(env.ctx(driver_url=url, driver_version="latest"))
    assert plan.summary["driver_version"] == LATEST_V


def test_stale_downloads_are_cleared_before_fetching(env):
    ctx = env.ctx(preload=True)
    stale = env.tools_dir / COS_BUILD_ID / ".downloads/x86_64-cros-linux-gnu-2023.tar.xz"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"half a toolchain from a killed run")
    plan = CosFlow().plan(probe(ctx))
    step(plan, "fetch_artifacts").run(ctx)
    assert not stale.exists()
    assert (env.tools_dir / COS_BUILD_ID / ".downloads/toolchain.tar.xz").is_file()


def test_exit_10_says_why_existing_prebuilt_modules_are_not_used(env):
    env.kernel.set_sig_enforce(True)
    env.bucket.prebuilt_versions = (DEFAULT_V,)
    ctx = env.ctx(kernel_module_type="proprietary")
    plan = CosFlow().plan(probe(ctx))
    with pytest.raises(SecureBootError, match="cannot be used here: prebuilt modules are open"):
        step(plan, "check_module_signing").run(ctx)
