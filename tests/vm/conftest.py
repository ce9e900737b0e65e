"""Fixtures of the qemu tier: provisioning, the driver .run files, one guest node.

The whole tier shares one guest ("node") and boots it twice: ``boot_install`` (first
install, cache hit, replacement, in-use refusals) and ``boot_reboot`` (the same disk after
a reboot: cache hit without rebuilding, wrong load order, a module built for another
kernel, an unresolved symbol, then signature enforcement switched on: ``boot_sig_enforce``
is its last steps, scenario.enforce_steps). A second guest ("real_node") gets NVIDIA's real
modules built on the host, in one boot: ``boot_real`` (each real install), then
``boot_bundle`` (the real 535 install as a bundle, installed with ``--prebuilt-only`` on a
fresh install dir; tests/vm/bundles.py), then ``boot_real_enforced``. A boot costs about
20 s before its first step under TCG, so tests share one wherever the state they need
can be made in it. Each test asserts on the results of the steps those boots ran.

NVIDIA's real builds (535, 470 for 6.1; 550 open and proprietary for 6.12) run on one
background thread, started when the first guest boots: on two cores the host builds and
the single-threaded qemu overlap instead of taking turns. The tests run in the order
that lets them (``TEST_ORDER``): the guests that need no real build first.

Environment:
  NDI_VM_SKIP=1        skip the tier
  NDI_VM=1             run it even when pytest is not pointed at tests/vm (plain
                       ``pytest``/``make test`` skip it: it is ``make test-vm``'s)
  NDI_VM_REQUIRED=1    fail (instead of skip) when it cannot be provisioned (CI)
  NDI_VM_BUILD_ALL=1   compile every driver version in the guest (slow: ~2 min each)
  NDI_VM_CACHE=DIR     cache dir (default /var/cache/ndi-vm)
  NDI_VM_KEEP=DIR      keep the guest's work dir (disk, serial logs) in DIR
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests import tiers
from tests.vm import driver_run, host_builds
from tests.vm import provision as prov
from tests.vm.harness import BootResult, GuestVM, make_data_disk
from tests.vm.scenario import (
    BUNDLE_FLAVOR,
    BUNDLE_SET,
    GSP_FILES,
    R550_FLAVORS,
    REAL_FLAVORS,
    VERSIONS,
    bundle_steps,
    install_steps,
    r550_reboot_steps,
    r550_steps,
    real_parts_steps,
    real_sig_enforce_steps,
    reboot_steps,
    sig_enforce_steps,
)

TIMINGS: dict[str, float] = {}
BOOTS: list[BootResult] = []


HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vm: boots a real kernel under qemu (slow tier)")


def _asked_for_vm(config: pytest.Config) -> bool:
    """True when the command line names this tier's dir (or something in it), or NDI_VM=1."""
    return tiers.asked_for(config, HERE, "NDI_VM")


# Files in the order they run: the guests that need no real NVIDIA build first, while
# those builds run in the background (module docstring).
TEST_ORDER = ("test_harness.py", "test_vm.py", "test_real_modules.py", "test_real_bundle.py",
              "test_r550.py")


def _order(item: pytest.Item) -> int:
    path = Path(str(item.path))
    if HERE not in path.parents:
        return len(TEST_ORDER) + 1  # other dirs (tests/realparts) after this tier's own
    return TEST_ORDER.index(path.name) if path.name in TEST_ORDER else len(TEST_ORDER)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The plain test run (pytest, make test) leaves this slow tier to make test-vm."""
    if _asked_for_vm(config):
        items.sort(key=_order)  # stable: each file keeps its own order
        return
    skip = pytest.mark.skip(reason="qemu tier: run `make test-vm` (or pytest tests/vm)")
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def vm_assets(request: pytest.FixtureRequest) -> prov.VMAssets:
    if os.environ.get("NDI_VM_SKIP"):
        pytest.skip("NDI_VM_SKIP is set")
    host_builds.start_builds(request.session, TIMINGS)  # beside this guest's provisioning
    t0 = time.monotonic()
    try:
        assets = prov.provision()
    except prov.ProvisionError as exc:
        if os.environ.get("NDI_VM_REQUIRED"):
            pytest.fail(f"cannot provision the qemu tier: {exc}")
        pytest.skip(f"cannot provision the qemu tier: {exc}")
    TIMINGS["provision"] = round(time.monotonic() - t0, 1)
    return assets


@pytest.fixture(scope="session")
def vm_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    keep = os.environ.get("NDI_VM_KEEP")
    if keep:
        path = Path(keep)
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path
    return tmp_path_factory.mktemp("vm")


@pytest.fixture(scope="session")
def driver_files(vm_assets: prov.VMAssets, vm_workdir: Path):
    """Files the guest gets under /ndi/files, per boot: .run per version, test modules.

    Returns {"install": Future[dict], "reboot": Future[dict]}: what only the
    second boot needs is built here while the first boot runs.
    """
    build_all = bool(os.environ.get("NDI_VM_BUILD_ALL"))
    headers = vm_assets.headers_dir
    release = vm_assets.kernel_release
    fake_release = driver_run.other_release(release)
    work = vm_workdir / "host-build"
    runs = vm_workdir / "runs"
    run_path = {k: runs / driver_run.run_name(v) for k, v in VERSIONS.items()}

    def first_boot() -> dict[str, Path]:
        t0 = time.monotonic()
        b_build = driver_run.build_modules(headers, work / "b", VERSIONS["b"])
        files = {
            # a: the first install compiles in the guest, always.
            run_path["a"].name: driver_run.build_run(runs, VERSIONS["a"]),
            run_path["b"].name: driver_run.build_run(
                runs, VERSIONS["b"], prebuilt=None if build_all else b_build
            ),
            # c is refused before it is downloaded; if it ever got further it
            # would compile in the guest (slow, but right).
            run_path["c"].name: driver_run.build_run(runs, VERSIONS["c"]),
            # A module that links against nvidia.ko: loading it makes nvidia "in use".
            "nvidia_holder.ko": driver_run.build_holder(headers, work / "holder", b_build / "Module.symvers"),
        }
        TIMINGS["host builds (boot install)"] = round(time.monotonic() - t0, 1)
        return files

    def second_boot() -> dict[str, Path]:
        t0 = time.monotonic()
        # d: modules built for another kernel release (vermagic and CRCs).
        d_build = driver_run.build_modules(headers, work / "d", VERSIONS["d"])
        for m in driver_run.MODULE_FILES:
            driver_run.as_built_for(d_build / f"{m}.ko", release, fake_release)
        files = {
            run_path["d"].name: driver_run.build_run(
                runs,
                VERSIONS["d"],
                prebuilt=None if build_all else d_build,
                vermagic=fake_release if build_all else None,
            ),
            "other-kernel/nvidia.ko": d_build / "nvidia.ko",
        }
        # e: an nvidia-uvm that needs a symbol its nvidia.ko does not export.
        e_build = driver_run.build_modules(headers, work / "e", VERSIONS["e"], broken_uvm=True)
        files[run_path["e"].name] = driver_run.build_run(runs, VERSIONS["e"], prebuilt=e_build)
        TIMINGS["host builds (boot reboot, during boot install)"] = round(time.monotonic() - t0, 1)
        return files

    first = first_boot()
    pool = ThreadPoolExecutor(max_workers=1)
    second = pool.submit(second_boot)
    yield {"install": first, "reboot": second}
    pool.shutdown(wait=True)


@pytest.fixture(scope="session")
def node(request: pytest.FixtureRequest, vm_assets: prov.VMAssets, vm_workdir: Path):
    host_builds.start(request.session, vm_assets, TIMINGS)  # the 6.12 guest's root, beside the builds
    guest = GuestVM(vm_assets, vm_workdir / "node")
    yield guest
    if not os.environ.get("NDI_VM_KEEP"):
        guest.disk.unlink(missing_ok=True)  # the serial logs stay


def _boot(node: GuestVM, name: str, steps, files, cmdline: str = "") -> BootResult:
    result = node.boot(name, steps, files=files, cmdline=cmdline)
    BOOTS.append(result)
    TIMINGS[f"boot {name}"] = result.seconds
    if not result.finished:
        pytest.fail(result.failure())
    return result


@pytest.fixture(scope="session")
def boot_install(node: GuestVM, driver_files) -> BootResult:
    return _boot(node, "install", install_steps(), driver_files["install"])


@pytest.fixture(scope="session")
def boot_reboot(node: GuestVM, boot_install: BootResult, driver_files) -> BootResult:
    return _boot(node, "reboot", reboot_steps() + sig_enforce_steps(),
                 driver_files["reboot"].result())


@pytest.fixture(scope="session")
def boot_sig_enforce(boot_reboot: BootResult) -> BootResult:
    """The reboot's last steps: enforcement switched on at run time (scenario.enforce_steps)."""
    return boot_reboot


# ------------------------------------------------- NVIDIA's real modules


def _real_parts_unavailable(what: str, exc: Exception) -> None:
    if os.environ.get("NDI_VM_REQUIRED"):
        pytest.fail(f"{what}: {exc}")
    pytest.skip(f"{what}: {exc}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    host_builds.shutdown()


@pytest.fixture(scope="session")
def real_installs(request: pytest.FixtureRequest, vm_assets: prov.VMAssets):
    """NVIDIA's real 535 (proprietary, open) and 470 installs, built on this machine by the
    installer itself through its sandbox (tests/realparts, cached). Returns
    ({REAL_FLAVORS name: install dir}, {"main": V, "legacy": V})."""
    from tests.realparts import provision

    host_builds.start(request.session, vm_assets, TIMINGS)
    try:
        installs, versions, abi = host_builds.real_installs(TIMINGS).result()
    except provision.ProvisionError as exc:
        _real_parts_unavailable("cannot provision NVIDIA's real parts", exc)
    assert abi == vm_assets.kernel_release, "host headers and guest kernel must agree"
    return installs, versions


@pytest.fixture(scope="session")
def real_data(vm_assets: prov.VMAssets, vm_workdir: Path, real_installs):
    """The real node's data disk: the real installs, the firmware-request test module and,
    under scenario.BUNDLE_SET, the bundles (tests/vm/bundles.py: the real 535 install as a
    bundle, a tampered copy, a bundle for another kernel).
    Returns (image, {"main": V, "legacy": V}, Bundles)."""
    from installer.records.bundle_manifest import BundleKey
    from tests.vm import bundles

    installs, versions = real_installs
    t0 = time.monotonic()
    data, scratch = vm_workdir / "real-data", vm_workdir / "bundle-scratch"
    for d in (data, scratch):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
    for name, install_dir in installs.items():
        shutil.copytree(install_dir, data / name, symlinks=True)
    shutil.copy2(driver_run.build_fwreq(vm_assets.headers_dir, vm_workdir / "fwreq"), data)
    key, module_type = REAL_FLAVORS[BUNDLE_FLAVOR]
    (data / BUNDLE_SET).mkdir()
    made = bundles.make(installs[BUNDLE_FLAVOR],
                        BundleKey(versions[key], vm_assets.kernel_release, module_type),
                        data / BUNDLE_SET, scratch)
    image = make_data_disk(data, vm_workdir / "real-data.img")
    shutil.rmtree(data)
    TIMINGS["real parts: data disk (installs, fwreq, bundles packed and tampered)"] = round(
        time.monotonic() - t0, 1)
    return image, versions, made


@pytest.fixture(scope="session")
def real_node(vm_assets: prov.VMAssets, vm_workdir: Path):
    guest = GuestVM(vm_assets, vm_workdir / "real-node")
    yield guest
    if not os.environ.get("NDI_VM_KEEP"):
        guest.disk.unlink(missing_ok=True)


def _boot_real(node: GuestVM, name: str, steps, image: Path, cmdline: str = "") -> BootResult:
    result = node.boot(name, steps, data_disk=image, cmdline=cmdline, timeout=1500)
    BOOTS.append(result)
    TIMINGS[f"boot {name}"] = result.seconds
    if not result.finished:
        pytest.fail(result.failure())
    return result


@pytest.fixture(scope="session")
def boot_real(real_node: GuestVM, real_data) -> BootResult:
    """One boot: each real install, then bundles on a fresh install dir, then enforcement."""
    image, versions, made = real_data
    steps = real_parts_steps(versions) + bundle_steps(made) + real_sig_enforce_steps(versions)
    return _boot_real(real_node, "real-parts", steps, image)


@pytest.fixture(scope="session")
def boot_bundle(boot_real: BootResult) -> BootResult:
    """The real boot's middle steps: a fresh install dir, every install from a bundle."""
    return boot_real


@pytest.fixture(scope="session")
def boot_real_enforced(boot_real: BootResult) -> BootResult:
    """The real boot's last steps: enforcement switched on at run time."""
    return boot_real


# ------------------------------ R550 (open and proprietary) in Debian's 6.12 kernel


def _r550(request: pytest.FixtureRequest, vm_assets: prov.VMAssets) -> tuple:
    from tests.realparts.provision import ProvisionError

    host_builds.start(request.session, vm_assets, TIMINGS)
    try:
        built = host_builds.r550(TIMINGS).result()
        return (host_builds.guest_612(vm_assets, TIMINGS).result(), *built)
    except (ProvisionError, prov.ProvisionError) as exc:
        _real_parts_unavailable("cannot provision the 6.12 kernel or NVIDIA's 550 parts", exc)


@pytest.fixture(scope="session")
def newer_kernel(request: pytest.FixtureRequest, vm_assets: prov.VMAssets):
    """Debian's 6.12 (tests/realparts/newer_kernel.py) under the same guest userland.
    Returns (VMAssets of the 6.12 guest, its unpacked Headers)."""
    assets, headers, *_ = _r550(request, vm_assets)
    return assets, headers


@pytest.fixture(scope="session")
def r550_installs(request: pytest.FixtureRequest, vm_assets: prov.VMAssets, newer_kernel):
    """NVIDIA's real 550.163.01, open and proprietary, built for 6.12. Returns
    ({R550_FLAVORS name: RealInstall}, the version, the real parts)."""
    _assets, _headers, installs, v, parts = _r550(request, vm_assets)
    for name, done in installs.items():
        BUILT[name] = done
    return installs, v, parts


@pytest.fixture(scope="session")
def r550_data(newer_kernel, vm_workdir: Path, r550_installs):
    """The 6.12 guest's data disk: both installs, ndi_fwreq.ko built for 6.12, NVIDIA's
    real nvidia-smi + NVML 550, the open install as an indexed bundle."""
    from installer.records.bundle_manifest import BundleKey
    from tests.vm import bundles

    assets, _headers = newer_kernel
    installs, version, parts = r550_installs
    t0 = time.monotonic()
    data = vm_workdir / "r550-data"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir()
    for name, done in installs.items():
        shutil.copytree(done.install_dir, data / name, symlinks=True)
    shutil.copy2(driver_run.build_fwreq(assets.headers_dir, vm_workdir / "fwreq-612"), data)
    smi = data / "real-smi"
    smi.mkdir()
    shutil.copy2(parts.r550.nvidia_smi, smi / "nvidia-smi")
    shutil.copy2(parts.r550.libnvidia_ml, smi / parts.r550.libnvidia_ml.name)
    (smi / "libnvidia-ml.so.1").symlink_to(parts.r550.libnvidia_ml.name)
    bundles.make_indexed(installs["install-550-open"].install_dir,
                         BundleKey(version, assets.kernel_release, "open"), data / "bundles")
    image = make_data_disk(data, vm_workdir / "r550-data.img")
    shutil.rmtree(data)
    TIMINGS["550: data disk (installs, fwreq, real nvidia-smi, bundle)"] = round(time.monotonic() - t0, 1)
    return image, version


@pytest.fixture(scope="session")
def r550_node(newer_kernel, vm_workdir: Path):
    assets, _headers = newer_kernel
    guest = GuestVM(assets, vm_workdir / "r550-node")
    yield guest
    if not os.environ.get("NDI_VM_KEEP"):
        guest.disk.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def boot_r550(r550_node: GuestVM, r550_data) -> BootResult:
    image, version = r550_data
    return _boot_real(r550_node, "r550", r550_steps(version), image)


@pytest.fixture(scope="session")
def boot_r550_reboot(r550_node: GuestVM, boot_r550: BootResult, r550_data) -> BootResult:
    image, version = r550_data
    return _boot_real(r550_node, "r550-reboot", r550_reboot_steps(version), image)


BUILT: dict = {}  # R550_FLAVORS name -> RealInstall, for the tier's log


# Steps whose kernel messages go into the test log (the "make test-vm" output).
KERNEL_LOG_STEPS = (
    "install-a",
    "install-b",
    "install-c-held",
    "wrong-order-uvm",
    "wrong-order-drm",
    "install-b-cached",
    "install-d-other-kernel",
    "kernel-rejects-other-kernel",
    "install-e-unknown-symbol",
    "install-b-enforced",
    "run-install-535",
    "run-install-470",
    "run-install-535-enforced",
    "bundle-install",
    *(f"run-{name}" for name in R550_FLAVORS),
    "bundle-550-open",
    # The GSP firmware proof for 550: what the kernel's firmware loader answered.
    *(f"firmware-{when}-{stem}" for when in ("before", "after", "rebooted", "from-cache")
      for stem in (f.split(".")[0] for f in GSP_FILES)),
)
# Steps whose output goes into the test log: what the kernel will check of each module.
OUTPUT_LOG_STEPS = (*(f"modinfo-{name}" for name in R550_FLAVORS), "uname", "real-smi-classified")


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001
    if not TIMINGS and not BOOTS:
        return
    tr = terminalreporter
    tr.section("qemu tier")
    for key, value in TIMINGS.items():
        tr.write_line(f"{key}: {value} s")
    for boot in BOOTS:
        tr.write_line(f"serial log of boot {boot.name}: {boot.serial_log}")
        for step in boot.steps.values():
            tr.write_line(f"  step {step.name}: rc={step.rc} in {step.seconds} s")
    for name, done in BUILT.items():
        build = done.event("kernel_modules_build_started")
        user = done.event("nvidia_installer_started")
        tr.write_line(f"{name}: built through the installer in {done.seconds} s (exit {done.rc}):")
        tr.write_line(f"    $ {' '.join(build['argv'])}")
        tr.write_line(f"    $ {' '.join(user['argv'])}")
    for boot in BOOTS:
        for name in OUTPUT_LOG_STEPS:
            step = boot.steps.get(name)
            if step and step.stdout.strip():
                tr.write_line(f"output of {name} (boot {boot.name}, rc={step.rc}):")
                for line in step.stdout.splitlines():
                    tr.write_line(f"    {line}")
        for name in KERNEL_LOG_STEPS:
            step = boot.steps.get(name)
            if step and step.dmesg:
                tr.write_line(f"kernel messages during {name} (boot {boot.name}):")
                for line in step.dmesg:
                    tr.write_line(f"    {line}")
