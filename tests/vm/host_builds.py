"""NVIDIA's real builds for the qemu tier, on one background thread.

535 and 470 (for the 6.1 guest) and 550 open and proprietary (for Debian's 6.12 and its
guest) are built on this machine by the installer itself through its sandbox
(tests/realparts, cached by inputs); tests/realparts' own builds (535 open through the
installer, which fails by design; the direct kbuilds it compares with; the stand-in's
refused install) follow them, and tests/realparts, which runs last, finds them in the
cache (same calls, same keys).

All are queued when the 6.1 guest's provisioning begins (``start_builds``), after
NVIDIA's parts are fetched and unpacked (cold, mostly waiting on the network): none
needs a guest, and the qemu chain waits on this thread for most of the tier, so the
thread is the tier's critical path and never waits for a boot. On two cores the builds
and the single-threaded qemu overlap instead of taking turns. A second thread fetches
the 6.12 kernel beside the 535 build and, once the 6.1 guest is provisioned
(``start``), makes the 6.12 guest's root from the 6.1 guest's. The fixtures wait on the
futures (``real_installs``, ``r550``, ``guest_612``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.vm import provision as prov
from tests.vm.scenario import R550_FLAVORS, REAL_FLAVORS

POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvidia-builds")
# The 6.12 guest's root (hard links, depmod, mkfs: I/O more than CPU) beside the builds,
# not before the 550 ones on their thread.
GUEST_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="guest-roots")
_STARTED: dict[str, Future] = {}
# tests/realparts files whose tests build real NVIDIA modules (``_build_realparts``).
REALPARTS_BUILDS = {"test_through_installer.py", "test_realparts.py"}


def _once(name: str, build: Callable[[], object], pool: ThreadPoolExecutor = POOL) -> Future:
    """``build`` on the host-build thread (or ``pool``), started once per session."""
    if name not in _STARTED:
        _STARTED[name] = pool.submit(build)
    return _STARTED[name]


def shutdown() -> None:
    for pool in (POOL, GUEST_POOL):
        pool.shutdown(wait=False, cancel_futures=True)


def _wanted(session: pytest.Session) -> tuple[set[str], set[str]]:
    """(the fixtures the collected tests use, the tests/realparts files collected)."""
    needs = {f for item in session.items for f in getattr(item, "fixturenames", ())}
    files = {Path(str(item.path)).name for item in session.items
             if Path(str(item.path)).parent.name == "realparts"}  # tests/realparts
    return needs, files


def start_builds(session: pytest.Session, timings: dict) -> None:
    """Every real build the collected tests will need, queued on the build thread when
    the 6.1 guest's provisioning begins: NVIDIA's parts and the 6.12 kernel (downloads,
    unpacking: cold, mostly waiting on the network), then the 535 and 470 installs, the
    550 ones, tests/realparts' own builds. None needs a guest, so the thread never waits
    for one (it is the tier's critical path)."""
    needs, files = _wanted(session)
    want_612 = "newer_kernel" in needs
    if want_612 or "real_installs" in needs or files & REALPARTS_BUILDS:
        _once("downloads", lambda: _download(want_612, timings))
    if "real_installs" in needs:
        real_installs(timings)
    if want_612:
        r550(timings)
    if files & REALPARTS_BUILDS:
        _once("realparts", lambda: _build_realparts(files, timings))


def start(session: pytest.Session, vm_assets: prov.VMAssets, timings: dict) -> None:
    """Once the 6.1 guest is provisioned: the builds (if not yet queued) and, on the
    second thread, the 6.12 guest's root (made from the 6.1 guest's)."""
    start_builds(session, timings)
    if "newer_kernel" in _wanted(session)[0]:
        guest_612(vm_assets, timings)


def _download(want_612: bool, timings: dict) -> None:
    """What the builds fetch first, fetched ahead (cached: the builds then find it). A
    failure is left to the build or test that makes the same call, which reports it.
    The 6.12 kernel, which only the 550 builds and the 6.12 guest need, is fetched on the
    second thread beside the 535 build (both take the parts cache's lock: ``_parts``
    keeps the builds from asking for it again)."""
    t0 = time.monotonic()
    _parts()
    timings["real parts: fetched and unpacked (background, first)"] = round(
        time.monotonic() - t0, 1)
    if want_612:
        _once("kernel-612", lambda: _fetch_612(timings), GUEST_POOL)


@functools.cache
def _parts():
    """NVIDIA's parts, provisioned once per session (provision.provision: cached; a failure
    is not kept, so the next caller tries again and reports it)."""
    from tests.realparts import provision

    return provision.provision()


def _fetch_612(timings: dict) -> None:
    from tests.realparts import newer_kernel as nk

    t0 = time.monotonic()
    nk.newer_kernel()
    timings["6.12 kernel: fetched and unpacked (second thread)"] = round(time.monotonic() - t0, 1)


def real_installs(timings: dict) -> Future:
    """Future of ({REAL_FLAVORS name: install dir}, {"main": V, "legacy": V}, the ABI of
    the headers they were built against, which the caller checks against its guest's)."""
    return _once("real", lambda: _build_real_installs(timings))


def r550(timings: dict) -> Future:
    """Future of (the 6.12 Headers, {R550_FLAVORS name: RealInstall}, the version, the
    real parts)."""
    return _once("r550", lambda: _build_r550(timings))


def guest_612(vm_assets: prov.VMAssets, timings: dict) -> Future:
    """Future of the 6.12 guest's VMAssets (on the second thread)."""
    return _once("guest-612", lambda: _guest_612(vm_assets, timings), GUEST_POOL)


def _wait_for_host_packages() -> None:
    """The builds start beside the 6.1 guest's provisioning, whose apt-get runs on this
    machine must not meet theirs (kbuild.kernel_headers, provision.host_tools) on the dpkg
    lock: with a host tool or the headers missing (CI installs them first: make
    deps-tiers), wait for the provisioning (it holds its cache lock throughout and
    installs the same headers) before anything is installed."""
    import shutil

    from tests.realparts import kbuild
    from tests.realparts import provision as parts

    abi = prov.pick_abi(prov._Apt(parts.default_log), parts.default_log)
    if (all(shutil.which(tool) for tool in parts.HOST_TOOLS)
            and kbuild.installed_version(f"linux-headers-{abi}") is not None):
        return
    with prov.locked(prov.CACHE_ROOT / ".lock"):
        pass
    parts.host_tools()


def _build_real_installs(timings: dict) -> tuple[dict, dict, str]:
    from tests.fixtures.runfile import driver_payload
    from tests.realparts import kbuild, runfile
    from tests.realparts.through_installer import install_real

    t0 = time.monotonic()
    _wait_for_host_packages()
    parts = _parts()
    headers = kbuild.kernel_headers()  # the ABI the 6.1 guest is provisioned with (pick_abi)
    versions = {"main": parts.main.version, "legacy": parts.legacy.version}
    installs = {}
    for name, (key, module_type) in REAL_FLAVORS.items():
        v = versions[key]
        run = runfile.build_real_run(v, "full", parts, userspace=driver_payload(v))
        installs[name] = install_real(run, v, module_type, headers).install_dir
    timings["real parts: host builds through the installer (background)"] = round(time.monotonic() - t0, 1)
    return installs, versions, headers.abi


def _guest_612(vm_assets: prov.VMAssets, timings: dict) -> prov.VMAssets:
    from tests.realparts import newer_kernel as nk

    k = nk.newer_kernel()  # fetched and unpacked before, on this thread (``_fetch_612``)
    t0 = time.monotonic()
    assets = prov.provision_extra_kernel(k.headers.abi, k.image_deb, k.headers.output, vm_assets)
    timings["6.12 kernel: guest root (background, beside the builds)"] = round(
        time.monotonic() - t0, 1)
    return assets


def _build_r550(timings: dict) -> tuple:
    from tests.fixtures.runfile import driver_payload
    from tests.realparts import newer_kernel as nk
    from tests.realparts import runfile
    from tests.realparts.through_installer import install_real

    t0 = time.monotonic()
    k = nk.newer_kernel()
    parts = _parts()
    v = parts.r550.version
    run = runfile.build_real_run(v, "full", parts, userspace=driver_payload(v))
    installs = {name: install_real(run, v, module_type, k.headers)
                for name, module_type in R550_FLAVORS.items()}
    timings["550: host builds through the installer (background; cold: minutes)"] = round(
        time.monotonic() - t0, 1)
    return k.headers, installs, v, parts


def _build_realparts(files: set[str], timings: dict) -> None:
    """tests/realparts' builds, made ahead of its tests with exactly the calls they make
    (tests/realparts/test_through_installer.py, test_realparts.py), so the cache keys are
    theirs. A failure here is not reported here: the test that needs the result makes the
    same call and reports it."""
    from tests.fixtures.runfile import driver_payload
    from tests.realparts import kbuild, provision, runfile, standin
    from tests.realparts.through_installer import install_real

    t0 = time.monotonic()
    provision.host_tools()
    parts = _parts()
    headers = kbuild.kernel_headers()
    v = parts.main.version
    # In the order the tests ask (test_realparts.py runs before test_through_installer.py).
    kbuild.cached_objects(parts.main.kernel, headers, kbuild.COMPARED_OBJECTS)  # both compare
    if "test_realparts.py" in files:
        kbuild.cached_build(parts.main.kernel, headers, source=headers.output,
                            output=headers.output, allow_failure=True)
        standin.cached_install(runfile.build_real_run(v, "full", parts), headers,
                               headers.output, None)
    if "test_through_installer.py" in files:
        run = runfile.build_real_run(v, "full", parts, userspace=driver_payload(v))
        install_real(run, v, "open", headers, expect_ok=False)
        kbuild.cached_objects(parts.main.kernel_open, headers, [kbuild.OPEN_535_FAILING_OBJECT],
                              allow_failure=True)
    timings["realparts: its own builds (background, after the 550 ones)"] = round(
        time.monotonic() - t0, 1)
