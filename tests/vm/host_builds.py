"""NVIDIA's real builds for the qemu tier, on one background thread.

535 and 470 (for the 6.1 guest) and 550 open and proprietary (for Debian's 6.12 and its
guest) are built on this machine by the installer itself through its sandbox
(tests/realparts, cached by inputs). They start when the first guest boots
(``start``): on two cores the host builds and the single-threaded qemu then overlap
instead of taking turns. The fixtures wait on the futures (``real_installs``, ``r550``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.vm import provision as prov
from tests.vm.scenario import R550_FLAVORS, REAL_FLAVORS

POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvidia-builds")
_STARTED: dict[str, Future] = {}


def _once(name: str, build: Callable[[], object]) -> Future:
    """``build`` on the host-build thread, started once per session."""
    if name not in _STARTED:
        _STARTED[name] = POOL.submit(build)
    return _STARTED[name]


def start(session: pytest.Session, vm_assets: prov.VMAssets, timings: dict) -> None:
    """Start the real builds the collected tests will need."""
    needs = {f for item in session.items for f in getattr(item, "fixturenames", ())}
    if "real_installs" in needs:
        real_installs(vm_assets, timings)
    if "newer_kernel" in needs:
        r550(vm_assets, timings)


def real_installs(vm_assets: prov.VMAssets, timings: dict) -> Future:
    """Future of ({REAL_FLAVORS name: install dir}, {"main": V, "legacy": V})."""
    return _once("real", lambda: _build_real_installs(vm_assets, timings))


def r550(vm_assets: prov.VMAssets, timings: dict) -> Future:
    """Future of (6.12 guest VMAssets, its Headers, {R550_FLAVORS name: RealInstall},
    the version, the real parts)."""
    return _once("r550", lambda: _build_r550(vm_assets, timings))


def _build_real_installs(vm_assets: prov.VMAssets, timings: dict) -> tuple[dict, dict]:
    from tests.fixtures.runfile import driver_payload
    from tests.realparts import kbuild, provision, runfile
    from tests.realparts.through_installer import install_real

    t0 = time.monotonic()
    parts = provision.provision()
    headers = kbuild.kernel_headers()
    assert headers.abi == vm_assets.kernel_release, "host headers and guest kernel must agree"
    versions = {"main": parts.main.version, "legacy": parts.legacy.version}
    installs = {}
    for name, (key, module_type) in REAL_FLAVORS.items():
        v = versions[key]
        run = runfile.build_real_run(v, "full", parts, userspace=driver_payload(v))
        installs[name] = install_real(run, v, module_type, headers).install_dir
    timings["real parts: host builds through the installer (background)"] = round(time.monotonic() - t0, 1)
    return installs, versions


def _build_r550(vm_assets: prov.VMAssets, timings: dict) -> tuple:
    from tests.fixtures.runfile import driver_payload
    from tests.realparts import newer_kernel as nk
    from tests.realparts import provision, runfile
    from tests.realparts.through_installer import install_real

    t0 = time.monotonic()
    k = nk.newer_kernel()
    assets = prov.provision_extra_kernel(k.headers.abi, k.image_deb, k.headers.output, vm_assets)
    timings["6.12 kernel: headers, image, guest root (background)"] = round(time.monotonic() - t0, 1)
    t0 = time.monotonic()
    parts = provision.provision()
    v = parts.r550.version
    run = runfile.build_real_run(v, "full", parts, userspace=driver_payload(v))
    installs = {name: install_real(run, v, module_type, k.headers)
                for name, module_type in R550_FLAVORS.items()}
    timings["550: host builds through the installer (background; cold: minutes)"] = round(
        time.monotonic() - t0, 1)
    return assets, k.headers, installs, v, parts
