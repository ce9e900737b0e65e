"""Changing the driver on a node whose GPUs are busy (issue 23): stage for the next boot.

The old driver stays loaded and working, the pod runs (exit 0), the new version is built
and checked exactly as a fresh install is and kept in <install-dir>/.next-boot; after the
reboot it is installed with no download and no compile. ``--when-in-use fail`` (the default
by hand, docs/contract.md §4) keeps exit 8 naming the holders; in a pod the default is ``stage``.
"""

from __future__ import annotations

import json

import pytest

from tests.fixtures.node import tree_digest
from tests.integration.conftest import V1, V2
from tests.integration.test_operator import doctor, ready
from tests.pod import events, last_event, ok

pytestmark = pytest.mark.chroot

METRICS = "/var/lib/node_exporter/textfile_collector/nvidia.prom"
STAGE = {"NVIDIA_DRIVER_VERSION": V2, "WHEN_IN_USE": "stage",
         "NVIDIA_INSTALLER_METRICS_FILE": METRICS}


def _live(install) -> dict[str, str]:
    """The live install, its .next-boot and status.json aside."""
    return {k: v for k, v in tree_digest(install).items()
            if k != "status.json" and not k.startswith(".next-boot")}


def _module_calls(kernel, since: int) -> list[dict]:
    return [c for c in kernel.calls()[since:] if c["tool"] in ("insmod", "rmmod", "modprobe")]


def _staged(node, pod, kernel, server):
    """V1 installed and held by a workload, then V2 asked for with WHEN_IN_USE=stage."""
    ok(pod.run("install"))
    live = _live(node.install_dir)
    kernel.hold("nvidia")  # a workload has /dev/nvidia0 open
    calls = len(kernel.calls())
    proc = ok(pod.run("install", env=STAGE))
    return proc, live, calls


def test_in_use_driver_keeps_running_and_the_new_one_is_staged(node, pod, kernel, server):
    proc, live, calls = _staged(node, pod, kernel, server)
    final = last_event(proc)
    assert final["plan"] == "staged" and final["outcome"] == "ok"
    # The staged plan downloads and runs the new .run as root as a fresh one does: unpinned,
    # it is warned about the same way (issue 40: only "fresh" plans were).
    assert [e["event"] for e in events(proc.stderr)].count("artifacts_unpinned") == 1
    assert final["message"].startswith(f"NVIDIA driver {V1} keeps running (in use: nvidia: 1 "
                                       "reference(s)) and verified; ")
    assert f"{V2} is staged and installs at the next boot" in final["message"]
    # Nothing loaded or unloaded; the running driver and its install are as they were.
    assert _module_calls(kernel, calls) == []
    assert kernel.loaded()["nvidia"].version == V1
    assert _live(node.install_dir) == live
    # The new version, built and checked, waits with a record of its own.
    staged = node.install_dir / ".next-boot"
    assert f"CACHE_NVIDIA_DRIVER_VERSION={V2}" in (staged / ".cache").read_text()
    assert (staged / "drivers/nvidia.ko").is_file() and (staged / f"lib64/libcuda.so.{V2}").exists()
    assert not (node.install_dir / ".staging").exists()
    # Told everywhere: the status, readiness (the running driver, plus what is pending),
    # doctor (a warning with the way forward, no library-mismatch alarm).
    status = json.loads((node.install_dir / "status.json").read_text())
    # The running and the staged version are two fields (issue 34 §4): status.json, the
    # final log line, and below readiness and doctor.
    assert status["outcome"] == "ok" and status["driver_version"] == V1
    assert status["staged_driver_version"] == V2
    assert status["in_use_by"] == "nvidia: 1 reference(s)"
    assert "staged_for_next_boot" not in status
    assert (final["driver_version"], final["staged_driver_version"]) == (V1, V2)
    prom = (node.root / METRICS.lstrip("/")).read_text()
    assert f'nvidia_driver_installer_info{{driver_version="{V1}",plan="staged"' in prom
    assert f'nvidia_driver_installer_staged_for_next_boot{{driver_version="{V2}"}} 1' in prom
    r = ready(node)
    assert r["NVIDIA_DRIVER_VERSION"] == V1 and r["PENDING_DRIVER_VERSION"] == V2
    assert r["INSTALL_PLAN"] == "staged"
    code, found = doctor(pod)
    assert found["installer_status"]["verdict"] == "warn"
    assert f"driver {V1} keeps running" in found["installer_status"]["detail"]
    assert f"{V2} is staged for the next boot, kept in " in found["installer_status"]["detail"]
    assert "reboot" in found["installer_status"]["fix"]
    assert found["kernel_modules"]["verdict"] == "ok", found["kernel_modules"]


def test_a_restart_while_still_in_use_stages_again_without_a_download(node, pod, kernel, server):
    _staged(node, pod, kernel, server)
    before = len(server.requests)
    proc = ok(pod.run("install", env=STAGE))
    assert last_event(proc)["plan"] == "staged"
    assert server.requests[before:] == []
    assert "next_boot_taken" in [e.get("event") for e in events(proc.stderr)]
    assert (node.install_dir / ".next-boot/.cache").is_file()


def test_after_the_reboot_the_staged_driver_installs_without_download_or_build(
        node, pod, kernel, server):
    _staged(node, pod, kernel, server)
    kernel.unhold("nvidia")
    kernel.unload_all()  # the reboot
    before = len(server.requests)
    proc = ok(pod.run("install", env=STAGE))
    final = last_event(proc)
    assert final["plan"] == "fresh" and final["driver_version"] == V2
    assert server.requests[before:] == []
    skipped = {e["step"] for e in events(proc.stderr) if e.get("event") == "step_skipped"}
    assert {"download_driver", "extract_driver", "build_driver", "find_kernel_headers"} <= skipped
    assert kernel.loaded()["nvidia"].version == V2
    assert f"CACHE_NVIDIA_DRIVER_VERSION={V2}" in (node.install_dir / ".cache").read_text()
    assert not (node.install_dir / ".next-boot").exists()
    assert ready(node)["PENDING_DRIVER_VERSION"] == ""


def test_going_back_to_the_running_version_drops_what_was_staged(node, pod, kernel, server):
    _staged(node, pod, kernel, server)
    proc = ok(pod.run("install", env={**STAGE, "NVIDIA_DRIVER_VERSION": V1}))
    assert last_event(proc)["plan"] == "cached"
    assert not (node.install_dir / ".next-boot").exists()
    dropped = [e for e in events(proc.stderr) if e.get("event") == "next_boot_discarded"]
    assert dropped and f"driver {V1} is installed and is the one wanted" in dropped[0]["reason"]


def test_when_in_use_fail_is_exit_8_naming_the_holders_and_stages_nothing(
        node, pod, kernel, server):
    ok(pod.run("install"))
    kernel.hold("nvidia")
    before = len(server.requests)
    proc = pod.run("install", env={**STAGE, "WHEN_IN_USE": "fail"})
    assert proc.returncode == 8, proc.stderr[-2000:]
    assert "in use (nvidia: 1 reference(s))" in last_event(proc)["error"]
    assert server.requests[before:] == [] and not (node.install_dir / ".next-boot").exists()


def test_nothing_in_use_replaces_in_place_even_with_stage(node, pod, kernel, server):
    ok(pod.run("install"))
    proc = ok(pod.run("install", env=STAGE))
    assert last_event(proc)["plan"] == "fresh"
    assert kernel.loaded()["nvidia"].version == V2
    assert not (node.install_dir / ".next-boot").exists()


def test_uninstall_removes_what_waits_for_the_next_boot(node, pod, kernel, server):
    _staged(node, pod, kernel, server)
    kernel.unhold("nvidia")
    ok(pod.run("uninstall"))
    assert not (node.install_dir / ".next-boot").exists()


def test_a_same_configuration_restart_only_loads_what_is_missing(node, pod, kernel, server):
    """Issue 23 item 3: a restart changes nothing that is in place (no download, no unload);
    a module that went away (someone's rmmod) is loaded again, not ignored."""
    import subprocess

    ok(pod.run("install"))
    subprocess.run(["rmmod", "nvidia_uvm"], env=kernel.subprocess_env(), check=True)
    before, calls = len(server.requests), len(kernel.calls())
    proc = ok(pod.run("install"))
    assert last_event(proc)["plan"] == "cached" and server.requests[before:] == []
    assert [(c["tool"], c["argv"][0].rsplit("/", 1)[-1]) for c in _module_calls(kernel, calls)
            if c["tool"] != "modprobe"] == [("insmod", "nvidia-uvm.ko")]
    assert "nvidia_uvm" in kernel.loaded()


FIRMWARE_OFF = {"NVIDIA_MODULE_ARGS": "nvidia.NVreg_EnableGpuFirmware=0"}


def test_changed_module_args_reload_an_unused_driver(node, pod, kernel, server):
    """Issue 23 item 3: the module parameters are part of what makes the install; the
    readiness file says which ones the loaded driver got this boot."""
    ok(pod.run("install"))
    assert ready(node)["NVIDIA_MODULE_ARGS"] == ""
    calls = len(kernel.calls())
    proc = ok(pod.run("install", env=FIRMWARE_OFF))
    assert last_event(proc)["plan"] == "cached"
    tools = [(c["tool"], c["argv"][0].rsplit("/", 1)[-1]) for c in _module_calls(kernel, calls)]
    assert ("rmmod", "nvidia") in tools and ("insmod", "nvidia.ko") in tools
    insmod = next(c for c in kernel.calls()[calls:] if c["tool"] == "insmod"
                  and c["argv"][0].endswith("/nvidia.ko"))
    assert insmod["argv"][1:] == ["NVreg_EnableGpuFirmware=0"]
    assert ready(node)["NVIDIA_MODULE_ARGS"] == "nvidia.NVreg_EnableGpuFirmware=0"
    # The same parameters again: nothing reloaded.
    calls = len(kernel.calls())
    ok(pod.run("install", env=FIRMWARE_OFF))
    assert _module_calls(kernel, calls) == []


def test_changed_module_args_wait_while_the_driver_is_in_use(node, pod, kernel, server):
    ok(pod.run("install"))
    kernel.hold("nvidia")
    calls = len(kernel.calls())
    proc = ok(pod.run("install", env=FIRMWARE_OFF))
    assert _module_calls(kernel, calls) == []
    (warning,) = [e for e in events(proc.stderr) if e.get("event") == "module_args_not_applied"]
    assert "nvidia: 1 reference(s)" in warning["message"]
    # One message, not a second warning with other advice (issue 34 §5), and the final line
    # says the new parameters wait.
    assert [e for e in events(proc.stderr) if e.get("level") == "warning"
            and e.get("event", "").startswith("module_")] == [warning]
    assert last_event(proc)["message"].endswith(
        "it keeps the module parameters it was loaded with (in use: nvidia: 1 reference(s)): "
        "nvidia.NVreg_EnableGpuFirmware=0 apply at its next load")
    assert ready(node)["NVIDIA_MODULE_ARGS"] == ""  # still what the loaded driver has
