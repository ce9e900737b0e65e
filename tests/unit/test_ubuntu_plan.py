"""The Ubuntu distro's plans (fresh, cached) and its header lookup, against a fixture
Ubuntu node and a fake kernel (no root, no network, nothing run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from installer.base.errors import ExitCode, InstallerError, SecureBootError, UsageError
from installer.context import Context
from installer.detect import context, probe
from installer.distros.cos.options import CosOptions
from installer.distros.flows import for_host
from installer.distros.headers_build_flow import HeadersBuildFlow, find_kernel_headers
from installer.distros.ubuntu import Ubuntu
from installer.host import gpus
from installer.records import cache
from installer.records.cache import CacheKey, ModuleSource
from installer.settings import Settings, validate
from tests.fixtures.kernel import FakeKernel
from tests.fixtures.node import UBUNTU_KERNEL, build_ubuntu_node
from tests.fixtures.plans import ACTIVATE_STAGED, LOAD_CACHED

DEFAULT_DRIVER_VERSION = Ubuntu.default_version

FRESH_STEPS = [
    "check_gpu_compatibility", "check_module_loading", "check_module_signing",
        "check_loaded_driver",
    "prepare_staging", "take_next_boot", "find_kernel_headers", "download_driver",
    "extract_driver",
    "build_driver", *ACTIVATE_STAGED,
]
CACHED_STEPS = ["check_gpu_compatibility", "check_module_loading", "drop_next_boot", *LOAD_CACHED]
K80 = "0x102d"  # Kepler: R470 is its last branch, and only proprietary modules


class Env:
    """A fixture Ubuntu node and its FakeKernel, which the kernel seams point at."""

    def __init__(self, tmp_path: Path, monkeypatch, *, headers: bool = True):
        self.node = build_ubuntu_node(tmp_path / "node", headers=headers)
        self.kernel = FakeKernel(tmp_path / "kernel", UBUNTU_KERNEL)
        self.tesla = tmp_path / "tesla"
        self.kernel.activate(monkeypatch)

    def add_gpu(self, device: str = "0x27b8") -> None:  # an L4 unless told
        self.kernel.add_gpu(device=device)

    def ctx(self, **settings) -> Context:
        """The context the install command builds (the release read from the fake kernel)."""
        if "driver_url" not in settings:  # the two are refused together
            settings["driver_base_url"] = f"file://{self.tesla}"
        return probe(context(validate(Settings(host_root=self.node.root,
                                         install_dir=self.node.install_dir, **settings))))


@pytest.fixture
def env(tmp_path, monkeypatch):
    e = Env(tmp_path, monkeypatch)
    e.add_gpu()
    return e


def names(plan) -> list[str]:
    return [s.name for s in plan.steps]


def run_url(base: Path, version: str) -> str:
    return f"file://{base}/{version}/NVIDIA-Linux-x86_64-{version}.run"


def test_detected_as_ubuntu(env):
    assert for_host(env.ctx().host_info).distro is Ubuntu


def test_fresh_plan_builds_against_the_host_kernel(env):
    plan = HeadersBuildFlow(Ubuntu).plan(env.ctx())
    assert plan.kind == "fresh" and names(plan) == FRESH_STEPS
    assert plan.summary == {
        "driver_version": DEFAULT_DRIVER_VERSION, "kernel_release": UBUNTU_KERNEL,
        # An L4 on the R580 default: NVIDIA's default is open from R560.
        "kernel_module_type": "open",
        "driver_url": run_url(env.tesla, DEFAULT_DRIVER_VERSION),
    }
    download = next(s for s in plan.steps if s.name == "download_driver")
    assert download.detail == plan.driver_url == plan.summary["driver_url"]
    assert (plan.driver_version, plan.kernel_module_type) == (DEFAULT_DRIVER_VERSION, "open")
    # Planning wrote nothing (dry-run safety), and what --dry-run prints is JSON.
    assert not (env.node.install_dir / ".staging").exists()
    assert json.loads(json.dumps(plan.describe()))


def test_persistence_mode_is_the_last_step_before_the_dev_char_links(env):
    """nvidia-smi -pm 1 may make device files too: the links come after it."""
    assert names(HeadersBuildFlow(Ubuntu).plan(env.ctx(persistence_mode=True)))[-2:] == [
        "persistence_mode", "dev_char_links"]


def test_the_pci_bus_is_scanned_once_per_run(env, monkeypatch):
    """Issue 32 item 8: the default version, the module type, the cache key and the GPU
    check all read the GPUs; the bus is walked once (Context.pci_gpus)."""
    scans = []
    real = gpus.scan
    monkeypatch.setattr(gpus, "scan", lambda sys_dir: scans.append(sys_dir) or real(sys_dir))
    ctx = env.ctx()
    plan = HeadersBuildFlow(Ubuntu).plan(probe(ctx))
    checked = next(s for s in plan.steps if s.name == "check_gpu_compatibility").run(ctx)
    assert len(scans) == 1 and checked.module_type == plan.kernel_module_type


@pytest.mark.parametrize("requested", ["open", "proprietary"])
def test_requested_module_type_is_planned_and_keyed(env, requested):
    ctx = env.ctx(kernel_module_type=requested)
    assert HeadersBuildFlow(Ubuntu).plan(probe(ctx)).summary["kernel_module_type"] == requested
    key = HeadersBuildFlow(Ubuntu).cache_key(ctx, DEFAULT_DRIVER_VERSION)
    assert (key.source, key.module_type) == (ModuleSource.COMPILED, requested)


def test_explicit_version_is_pinned(env):
    plan = HeadersBuildFlow(Ubuntu).plan(env.ctx(driver_version="535.183.01"))
    assert plan.summary["driver_version"] == "535.183.01"
    assert plan.summary["driver_url"] == run_url(env.tesla, "535.183.01")


def test_driver_url_names_the_version(env):
    url = "https://127.0.0.1:1/mirror/NVIDIA-Linux-x86_64-550.90.07.run"
    plan = HeadersBuildFlow(Ubuntu).plan(env.ctx(driver_url=url))
    assert plan.summary["driver_version"] == "550.90.07" and plan.summary["driver_url"] == url


def test_default_falls_back_to_a_branch_the_gpu_supports(tmp_path, monkeypatch):
    e = Env(tmp_path, monkeypatch)
    e.add_gpu(K80)
    s = HeadersBuildFlow(Ubuntu).plan(e.ctx()).summary
    assert s["driver_version"].startswith("470.") and s["kernel_module_type"] == "proprietary"


@pytest.mark.parametrize("version", ["550", "latest", "550.127.05; rm -rf /"])
def test_bad_version_is_a_usage_error(env, version):
    with pytest.raises(UsageError, match="not a driver version"):
        HeadersBuildFlow(Ubuntu).plan(env.ctx(driver_version=version))


def test_enforced_signatures_are_the_one_exit_10_refusal(env):
    env.kernel.set_cmdline("module.sig_enforce=1")
    ctx = env.ctx()
    plan = HeadersBuildFlow(Ubuntu).plan(probe(ctx))
    step = next(s for s in plan.steps if s.name == "check_module_signing")
    with pytest.raises(SecureBootError) as err:
        step.run(ctx)
    assert err.value.exit_code == ExitCode.SECURE_BOOT == 10
    assert err.value.message == ("this node only loads signed kernel modules (module.sig_enforce=1 "
                                 "is on the kernel command line) and this flow builds unsigned "
                                 "modules")
    assert "--signing-key" in err.value.hint
    assert err.value.hint.endswith("this installer never edits boot config or reboots")


def test_preload_is_refused_on_ubuntu(env):
    with pytest.raises(UsageError) as err:
        HeadersBuildFlow(Ubuntu).check_settings(env.ctx(distro_options=(CosOptions(preload=True),)))
    assert err.value.exit_code == ExitCode.USAGE and "Container-Optimized OS" in err.value.message


def test_a_cos_artifacts_pin_is_refused_on_ubuntu(env):
    with pytest.raises(UsageError) as err:
        HeadersBuildFlow(Ubuntu).check_settings(env.ctx(
            distro_options=(CosOptions(artifacts_sha256="/pins.sha256"),)))
    assert "--cos-artifacts-sha256" in err.value.message and "Ubuntu" in err.value.message
    assert "--driver-sha256" in err.value.hint


def _install_files(root: Path, version: str) -> None:
    for rel, data in {"drivers/nvidia.ko": b"ko", "bin/nvidia-smi": b"smi",
                      f"lib64/libnvidia-ml.so.{version}": b"nvml"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def test_cache_hit_needs_version_kernel_and_module_type(env):
    ctx = env.ctx()
    _install_files(ctx.install.root, DEFAULT_DRIVER_VERSION)
    cache.write(ctx.install.cache_file, HeadersBuildFlow(Ubuntu).cache_key(ctx, DEFAULT_DRIVER_VERSION),
                ctx.install.root, "test")
    plan = HeadersBuildFlow(Ubuntu).plan(probe(ctx))
    assert plan.kind == "cached" and names(plan) == CACHED_STEPS
    assert plan.driver_url is None and "driver_url" not in plan.summary  # nothing to download
    assert HeadersBuildFlow(Ubuntu).plan(env.ctx(force=True)).kind == "fresh"
    assert HeadersBuildFlow(Ubuntu).plan(env.ctx(driver_version="535.183.01")).kind == "fresh"
    assert HeadersBuildFlow(Ubuntu).plan(env.ctx(kernel_module_type="proprietary")).kind == "fresh"
    other_kernel = CacheKey(DEFAULT_DRIVER_VERSION, kernel_release="5.15.0-1050-gke",
                            source=ModuleSource.COMPILED, module_type="open")
    cache.write(ctx.install.cache_file, other_kernel, ctx.install.root, "test")
    assert HeadersBuildFlow(Ubuntu).plan(env.ctx()).kind == "fresh"


def test_headers_on_the_host_are_found_without_apt(env):
    ctx = env.ctx()
    tree = find_kernel_headers().run(ctx).tree
    assert tree.source == env.node.headers_dir


def test_missing_headers_name_what_was_tried(tmp_path, monkeypatch):
    e = Env(tmp_path, monkeypatch, headers=False)
    monkeypatch.setenv("PATH", str(tmp_path / "no-apt"))  # no apt-get: nothing is installed
    with pytest.raises(InstallerError) as err:
        find_kernel_headers().run(e.ctx())
    assert UBUNTU_KERNEL in err.value.message


def test_explicit_kernel_source_path_is_the_only_place_looked(env, tmp_path):
    with pytest.raises(InstallerError) as err:
        find_kernel_headers().run(env.ctx(kernel_source_path=tmp_path / "nowhere"))
    assert "--kernel-source-path" in str(err.value.context) + err.value.message
