"""Operator experience end to end, run as the pod runs it: doctor, GPU limits,
replace/uninstall, post-load fixes, readiness and failure output.

Each scenario breaks a fixture node the way real nodes break and checks what
`doctor` says (the finding and its fix) and the exit code, and that `install`
and `uninstall` behave as documented.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.fixtures.kernel import UBUNTU_KERNEL as RELEASE
from tests.fixtures.kernel import UBUNTU_KERNEL_UPDATE
from tests.fixtures.node import INSTALL_HOST
from tests.fixtures.runfile import build_driver_run
from tests.integration.conftest import V1, V2
from tests.pod import events, last_event, ok

pytestmark = pytest.mark.chroot

READY = "run/nvidia/validations/driver-ready"
K80 = "0x102d"


def doctor(pod) -> tuple[int, dict[str, dict]]:
    proc = pod.run("doctor", "--json")
    assert proc.returncode in (0, 9), proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["healthy"] is (proc.returncode == 0)
    return proc.returncode, {f["check"]: f for f in doc["findings"]}


def ready(node) -> dict[str, str] | None:
    path = node.root / READY
    if not path.exists():
        return None
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def host_ld_cache(node) -> str:
    return subprocess.run(["ldconfig", "-p", "-C", str(node.root / "etc/ld.so.cache")],
                          capture_output=True, text=True, check=True).stdout


def use_k80(kernel) -> None:
    """Swap the fixture's L4 for a Tesla K80 at the same address."""
    (kernel.sys_dir / "bus/pci/devices/0000:00:04.0/device").write_text(K80 + "\n")


# -- a healthy node -------------------------------------------------------------


def test_healthy_node(node, pod, kernel):
    assert ready(node) is None
    detected = json.loads(ok(pod.run("detect", "-o", "json")).stdout)
    assert [(g["name"], g["arch"]) for g in detected["gpus"]] == [("NVIDIA L4", "Ada Lovelace")]
    result = json.loads(ok(pod.run("install", "-o", "json")).stdout)  # what status.json holds
    assert (result["outcome"], result["driver_version"], result["plan"]) == ("ok", V1, "fresh")
    code, found = doctor(pod)
    assert code == 0
    not_ok = {k: f["verdict"] for k, f in found.items() if f["verdict"] != "ok"}
    # No kubelet on a fixture node; V1 is an R550 release, a branch past its end of life.
    assert not_ok == {"device_plugin": "warn", "driver_branch": "warn"}
    assert "NVIDIA L4 at 0000:00:04.0" in found["gpus"]["detail"]
    assert f"libnvidia-ml.so.1 => {INSTALL_HOST}/lib64/libnvidia-ml.so.1" in (
        found["host_ld_cache"]["detail"])
    assert f"driver {V1}" in found["nvidia_smi"]["detail"]
    # The /dev/char links that keep NVML working after a systemd daemon-reload.
    for name, (major, minor) in kernel.devices().items():
        if name.startswith("nvidia"):
            assert os.readlink(kernel.dev_dir / "char" / f"{major}:{minor}") == f"../{name}"


def test_doctor_table_on_a_fresh_node(pod):
    proc = pod.run("doctor")
    assert proc.returncode == 9
    out = proc.stdout
    assert "  FAIL  cache" in out and "no .cache record" in out
    assert "fix: run install" in out
    assert out.rstrip().splitlines()[-1] != ""
    assert "UNHEALTHY" in out.split("\n\n")[-1]


# -- broken nodes, one at a time ------------------------------------------------


def test_missing_device_nodes(node, pod, kernel):
    ok(pod.run("install"))
    (kernel.dev_dir / "nvidia-uvm").unlink()
    code, found = doctor(pod)
    assert code == 9
    assert found["device_nodes"]["verdict"] == "fail"
    assert "missing: /dev/nvidia-uvm" in found["device_nodes"]["detail"]
    # The files of the loaded modules (no -m: nvidia-modeset is not loaded).
    assert found["device_nodes"]["fix"].endswith(
        "nvidia-modprobe -c255 -c0, then nvidia-modprobe -c0 -u")
    # The fix it names works: a re-run (a cache hit) recreates them.
    assert last_event(ok(pod.run("install")))["plan"] == "cached"
    assert doctor(pod)[0] == 0


def test_stale_cache_after_kernel_update(node, pod, kernel):
    ok(pod.run("install"))
    kernel.unload_all()  # the reboot into the new kernel
    (kernel.proc_dir / "sys/kernel/osrelease").write_text(UBUNTU_KERNEL_UPDATE + "\n")
    code, found = doctor(pod)
    assert code == 9
    assert found["cache"]["verdict"] == "fail"
    detail = found["cache"]["detail"]
    assert detail.startswith("stale:") and f"for kernel {RELEASE}" in detail
    assert f"the node runs kernel {UBUNTU_KERNEL_UPDATE}" in detail
    assert "rebuilds for the running kernel" in found["cache"]["fix"]
    assert found["kernel_modules"]["detail"] == "no NVIDIA kernel module is loaded"


def test_version_mismatch_with_modules_in_use(node, pod, kernel, server):
    ok(pod.run("install"))
    before = {p: p.read_bytes() for p in node.install_dir.rglob("*")
              if p.is_file() and p.name != "status.json"}
    kernel.hold("nvidia")  # a workload has /dev/nvidia0 open
    requests_before = len(server.requests)
    ready_before = (node.root / READY).read_text()
    proc = pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2})
    assert proc.returncode == 8, proc.stderr[-2000:]
    final = last_event(proc)
    assert final["event"] == "install_failed"
    assert "in use (nvidia: 1 reference(s))" in final["error"]
    assert final["message"].startswith("FAILED in step check_loaded_driver (module_load, exit 8)")
    assert "drain" in final["message"]
    assert len(server.requests) == requests_before
    assert kernel.loaded()["nvidia"].version == V1
    assert {p: p.read_bytes() for p in before} == before
    # Cleared at the start of the run, and back as it was: nothing changed.
    assert (node.root / READY).read_text() == ready_before

    code, found = doctor(pod)
    assert code == 9
    assert f"the upgrade to {V2} failed (module_load, exit 8)" in (
        found["installer_status"]["detail"])
    km = found["kernel_modules"]
    assert km["verdict"] == "warn" and "the one the install dir holds: it works" in km["detail"]
    assert f"the upgrade to {V2} failed (module_load, exit 8)" in km["detail"]
    assert "in use by nvidia: 1 reference(s)" in km["detail"]
    assert "kubectl drain" in km["fix"] and "mismatch" not in km["detail"]

    # Uninstall refuses too, naming the holders, and changes nothing.
    proc = pod.run("uninstall")
    assert proc.returncode == 8, proc.stderr[-2000:]
    assert "nvidia: 1 reference(s)" in last_event(proc)["error"]
    assert (node.install_dir / ".cache").exists() and kernel.loaded()["nvidia"].version == V1

    # Once drained, the replacement goes through.
    kernel.unhold("nvidia")
    ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2}))
    assert kernel.loaded()["nvidia"].version == V2
    assert ready(node)["NVIDIA_DRIVER_VERSION"] == V2


def test_doctor_after_a_failed_upgrade_says_the_old_driver_works(node, pod, kernel):
    """Issue 14: a 404 on the new version leaves the old driver loaded and intact; doctor
    says so, and why the upgrade failed, not "Driver/library version mismatch"."""
    ok(pod.run("install"))
    before = {p: p.read_bytes() for p in node.install_dir.rglob("*")
              if p.is_file() and p.name != "status.json"}
    missing = "550.99.99"
    proc = pod.run("install", env={"NVIDIA_DRIVER_VERSION": missing})
    assert proc.returncode == 5, proc.stderr[-2000:]
    error = last_event(proc)["error"]
    assert error.startswith("HTTP 404") and missing in error
    assert kernel.loaded()["nvidia"].version == V1
    assert {p: p.read_bytes() for p in before} == before
    # The run removed the readiness file first and, the node being as it was, put it back.
    assert ready(node)["NVIDIA_DRIVER_VERSION"] == V1

    code, found = doctor(pod)
    assert code == 9
    failed_how = f"the upgrade to {missing} failed (download, exit 5): {error}"
    fix = (f"publish the driver {missing} .run where the node downloads it, or fix "
           f"NVIDIA_DRIVER_VERSION (--driver-version), then re-run install (driver {V1} keeps "
           "working until then)")
    status = found["installer_status"]
    assert status["verdict"] == "fail"
    assert status["detail"].endswith(f"in step download_driver: {failed_how}. Driver {V1} is "
                                     "still loaded, installed intact and working")
    assert status["fix"] == f"{fix} (details: {INSTALL_HOST}/status.json)"  # the node's path
    km = found["kernel_modules"]
    assert (km["verdict"], km["fix"]) == ("warn", fix)
    assert km["detail"] == (f"driver {V1} loaded (nvidia_uvm, nvidia), the one the install dir "
                            f"holds: it works; {failed_how}; not in use")
    for check in ("cache", "install_dir", "nvidia_smi", "device_nodes", "readiness"):
        assert found[check]["verdict"] == "ok", found[check]
    assert "mismatch" not in json.dumps(found)
    text = pod.run("doctor").stdout
    assert f"Start with installer_status: publish the driver {missing} .run" in " ".join(
        text.split())

    # The fix it names works: NVIDIA_DRIVER_VERSION back to a published version (V1, cached)
    # installs, and readiness is written anew.
    assert last_event(ok(pod.run("install")))["plan"] == "cached"
    assert ready(node)["INSTALL_PLAN"] == "cached"


def test_k80_with_a_too_new_driver(node, pod, kernel, server):
    use_k80(kernel)
    proc = pod.run("install")  # NVIDIA_DRIVER_VERSION=550.54.14 is set explicitly
    assert proc.returncode == 2, proc.stderr[-2000:]
    final = last_event(proc)
    assert final["error_class"] == "usage"
    assert "too new for Tesla K80 at 0000:00:04.0" in final["error"]
    assert "R470 or older" in final["error"] and "470.256.02" in final["hint"]
    assert final["step"] == "check_gpu_compatibility"
    assert server.requests == []  # refused before any download
    code, found = doctor(pod)
    assert code == 9
    assert "too new for Tesla K80" in found["gpus"]["detail"]
    assert "usage (exit 2)" in found["installer_status"]["detail"]


def test_k80_default_falls_back_to_r470(node, pod, kernel, server, tmp_path):
    use_k80(kernel)
    run = build_driver_run(tmp_path / "r470", "470.256.02", kernel_module_type_support=False)
    server.serve(f"/tesla/470.256.02/{run.name}", run)
    proc = ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": "default"}))
    assert last_event(proc)["driver_version"] == "470.256.02"
    fallback = [e for e in events(proc.stderr) if e.get("event") == "driver_version_fallback"]
    assert "Tesla K80" in fallback[0]["reason"]
    assert kernel.loaded()["nvidia"].version == "470.256.02"
    assert ready(node)["NVIDIA_KERNEL_MODULE_TYPE"] == "proprietary"


@pytest.mark.parametrize("how", ["sig_enforce", "lockdown", "efivar"])
def test_secure_boot_on(node, pod, kernel, server, how):
    if how == "sig_enforce":
        kernel.set_sig_enforce(True)
    elif how == "lockdown":
        kernel.set_lockdown("integrity")
    else:
        efivar = kernel.sys_dir / "firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
        efivar.parent.mkdir(parents=True)
        efivar.write_bytes(b"\x06\x00\x00\x00\x01")
        kernel.set_lockdown("integrity")  # what Ubuntu's kernel does under Secure Boot
    proc = pod.run("install")
    assert proc.returncode == 10, proc.stderr[-2000:]
    assert server.requests == []
    code, found = doctor(pod)
    assert code == 9
    f = found["module_signing"]
    assert f["verdict"] == "fail" and "only loads signed modules" in f["detail"]
    assert {"sig_enforce": "module.sig_enforce", "lockdown": "lockdown=integrity",
            "efivar": "Secure Boot is on"}[how] in f["detail"]


def test_missing_ld_cache_entry(node, pod):
    ok(pod.run("install"))
    (node.root / "etc/ld.so.conf.d/nvidia.conf").unlink()
    subprocess.run(["ldconfig", "-r", str(node.root)], check=True, capture_output=True)
    code, found = doctor(pod)
    assert code == 9
    f = found["host_ld_cache"]
    assert f["verdict"] == "fail" and "libcuda.so.1 is not in the host ld cache" in f["detail"]
    assert "LD_LIBRARY_PATH=/usr/local/nvidia/lib64" in f["fix"]
    ok(pod.run("install"))  # the fix it names
    assert f"{INSTALL_HOST}/lib64/libcuda.so.1" in host_ld_cache(node)
    assert doctor(pod)[0] == 0


# -- uninstall --------------------------------------------------------------------


def test_uninstall_is_complete_and_idempotent(node, pod, kernel):
    ok(pod.run("install"))
    assert ready(node) is not None
    proc = ok(pod.run("uninstall", "-o", "json"))
    final = last_event(proc)
    assert final["event"] == "uninstall_finished" and "unloaded and removed" in final["message"]
    result = json.loads(proc.stdout)
    assert (result["outcome"], result["previous_driver_version"]) == ("uninstalled", V1)
    assert not [m for m in kernel.loaded() if m.startswith("nvidia")]
    assert [c["argv"] for c in kernel.calls("rmmod")] == [["nvidia_uvm"], ["nvidia"]]
    left = sorted(p.name for p in node.install_dir.iterdir())
    assert left == ["kernel-build.log", "nvidia-installer.log", "status.json"]  # logs stay
    assert json.loads((node.install_dir / "status.json").read_text())["outcome"] == "uninstalled"
    assert ready(node) is None
    assert not (node.root / "etc/ld.so.conf.d/nvidia.conf").exists()
    assert "libcuda.so.1" not in host_ld_cache(node)
    assert not [p for p in kernel.dev_dir.iterdir() if p.name.startswith("nvidia")]
    assert not any((kernel.dev_dir / "char").iterdir())

    again = ok(pod.run("uninstall"))
    assert "nothing to remove" in last_event(again)["message"]
    assert sorted(p.name for p in node.install_dir.iterdir()) == left
    assert len(kernel.calls("rmmod")) == 2

    code, found = doctor(pod)
    assert code == 9 and "uninstalled" in found["installer_status"]["detail"]
    # And it installs again afterwards.
    ok(pod.run("install"))
    assert doctor(pod)[0] == 0


def tree_state(*roots) -> dict[str, object]:
    """Every path under ``roots``: a file's bytes and mode, a link's target, a dir's mode."""
    state: dict[str, object] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [*dirnames, *filenames]:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                if os.path.islink(path):
                    state[path] = ("link", os.readlink(path))
                elif os.path.isfile(path):
                    with open(path, "rb") as fh:
                        state[path] = ("file", st.st_mode, fh.read())
                else:
                    state[path] = ("other", st.st_mode, st.st_rdev)
    return state


def test_uninstall_dry_run_lists_what_uninstall_removes_and_changes_nothing(node, pod, kernel):
    """Issue 41 §3: a cluster removal runbook needs a preview. The dry run's lists are what
    the real run then reports removing; the host tree, /dev and the kernel are as before."""
    ok(pod.run("install"))
    before = tree_state(node.root, kernel.dev_dir)
    loaded, calls = kernel.loaded(), len(kernel.calls())
    proc = ok(pod.run("uninstall", "--dry-run", "-o", "json"))
    assert tree_state(node.root, kernel.dev_dir) == before
    assert kernel.loaded() == loaded and len(kernel.calls()) == calls  # no rmmod, nothing run
    preview = json.loads(proc.stdout)
    assert (preview["outcome"], preview["previous_driver_version"]) == ("dry_run", V1)
    would = preview["dry_run"]["would_change"]
    assert would["modules_unloaded"] and would["install_dir_removed"] and would["readiness_removed"]
    text = ok(pod.run("uninstall", "--dry-run")).stdout
    assert "would_change:" in text and "nvidia_uvm" in text
    assert tree_state(node.root, kernel.dev_dir) == before

    done = json.loads(ok(pod.run("uninstall", "-o", "json")).stdout)["changes"]
    assert {k: sorted(v) if isinstance(v, list) else v for k, v in would.items()} == \
        {k: sorted(v) if isinstance(v, list) else v for k, v in done.items()}
    # Nothing left: the next preview lists nothing.
    after = json.loads(ok(pod.run("uninstall", "--dry-run", "-o", "json")).stdout)
    assert not any(after["dry_run"]["would_change"].values()), after


def test_uninstall_dry_run_refuses_a_driver_in_use_as_uninstall_does(node, pod, kernel):
    ok(pod.run("install"))
    kernel.hold("nvidia")
    dry = pod.run("uninstall", "--dry-run")
    real = pod.run("uninstall")
    assert dry.returncode == real.returncode == 8, dry.stderr[-2000:]
    assert last_event(dry)["message"] == last_event(real)["message"]


# -- readiness, persistence, module args, module type -------------------------


def test_readiness_only_after_success(node, pod, kernel, server):
    metrics = "/var/lib/node_exporter/textfile_collector/nvidia.prom"
    ok(pod.run("install", "--metrics-file", metrics))
    got = ready(node)
    assert got["NVIDIA_DRIVER_VERSION"] == V1 and got["IS_HOST_DRIVER"] == "true"
    assert got["NVIDIA_LIB_DIR_HOST"] == f"{INSTALL_HOST}/lib64" and got["GPU_COUNT"] == "1"
    assert "nvidia_driver_installer_success 1" in (node.root / metrics.lstrip("/")).read_text()

    # A failing run (bad checksum, after the lock) removes it first; having changed
    # nothing, it puts back the very file it found (docs/contract.md §4), not a new one.
    found = (node.root / READY).read_text()
    proc = pod.run("install", "--force", "--metrics-file", metrics,
                   env={"NVIDIA_DRIVER_SHA256": "0" * 64})
    assert proc.returncode == 6
    assert (node.root / READY).read_text() == found
    names = [e.get("event") for e in events(proc.stderr)]
    assert names.index("readiness_cleared") < names.index("readiness_restored")
    text = (node.root / metrics.lstrip("/")).read_text()
    assert "nvidia_driver_installer_success 0" in text
    assert "nvidia_driver_installer_exit_code 6" in text and 'error_class="integrity"' in text

    # The next good run (a cache hit) publishes it again.
    assert last_event(ok(pod.run("install")))["plan"] == "cached"
    assert ready(node)["INSTALL_PLAN"] == "cached"


def test_persistence_mode_and_module_args_on_fresh_and_cached_loads(node, pod, kernel):
    env = {"NVIDIA_PERSISTENCE_MODE": "1", "NVIDIA_MODULE_ARGS": "nvidia.NVreg_EnableGpuFirmware=0"}
    ok(pod.run("install", env=env))
    assert kernel.loaded()["nvidia"].params == {"NVreg_EnableGpuFirmware": "0"}
    assert ["-pm", "1"] in [c["argv"] for c in kernel.calls("nvidia-smi")]
    assert ready(node)["PERSISTENCE_MODE"] == "on"
    kernel.unload_all()  # reboot
    proc = ok(pod.run("install", env=env))
    assert last_event(proc)["plan"] == "cached"
    assert kernel.loaded()["nvidia"].params == {"NVreg_EnableGpuFirmware": "0"}
    assert [c["argv"] for c in kernel.calls("nvidia-smi")].count(["-pm", "1"]) == 2


def test_open_kernel_modules_on_request(node, pod, kernel):
    proc = ok(pod.run("install", "--kernel-module-type", "open"))
    make = next(e["argv"] for e in events(proc.stderr)
                if e.get("event") == "kernel_modules_build_started")
    assert make[:3] == ["make", "-C", "/tmp/nvidia-driver-installer/extract/kernel-open"]
    assert "--no-kernel-module" in (node.install_dir / "nvidia-installer.log").read_text()
    nvidia_line = next(ln for ln in (kernel.proc_dir / "modules").read_text().splitlines()
                       if ln.startswith("nvidia "))
    assert nvidia_line.endswith("(OE)")  # open modules do not taint P(roprietary)
    assert "CACHE_FLAVOR=compiled-open" in (node.install_dir / ".cache").read_text()
    assert ready(node)["NVIDIA_KERNEL_MODULE_TYPE"] == "open"
    # Asking for the proprietary ones next is a different install, not a cache hit.
    proc = ok(pod.run("install", env={"NVIDIA_KERNEL_MODULE_TYPE": "proprietary"}))
    assert last_event(proc)["plan"] == "fresh"


# -- failure output -------------------------------------------------------------------


def test_build_failure_shows_the_installer_log_and_kernel_log(node, pod):
    (node.root / f"usr/src/linux-headers-{RELEASE}/.fake-build-fails").write_text("")
    proc = pod.run("install")
    assert proc.returncode == 7
    final = last_event(proc)
    assert final["installer_log_tail"][0] == "(nvidia-installer.failed.log)"
    assert any("implicit declaration of function" in ln for ln in final["installer_log_tail"])
    assert final["kernel_log_tail"]  # lines, or why the kernel log is unreadable
    assert final["message"].startswith("FAILED in step build_driver (build, exit 7): ")
    assert "What to do:" in final["message"]
    status = json.loads((node.install_dir / "status.json").read_text())
    assert status["error_class"] == "build" and status["hint"]
    assert status["context"]["installer_log_tail"] == final["installer_log_tail"]


def test_console_failure_ends_with_a_sentence(node, pod):
    (node.root / f"usr/src/linux-headers-{RELEASE}/.fake-build-fails").write_text("")
    proc = pod.run("install", env={"LOG_FORMAT": "console"})
    assert proc.returncode == 7
    lines = proc.stderr.rstrip().splitlines()
    assert lines[-1].startswith("FAILED in step build_driver (build, exit 7): ")
    assert "What to do:" in lines[-1]
    at = lines.index("last lines of the installer log:")
    assert lines[at + 1] == "    (nvidia-installer.failed.log)"
