"""`doctor` on a node with no driver of ours (issue 34 §4): never installed, and after
`uninstall`. Its advice must fit what happened: no `--force`, no "a killed or failed run",
no `ok gpu_firmware` for firmware that is not there. And a staged version's fix is the
README's runbook (drain, reboot, uncordon), not "re-run install"."""

from __future__ import annotations

import pytest

from tests.integration.conftest import V2
from tests.integration.test_operator import doctor
from tests.pod import events, ok

pytestmark = pytest.mark.chroot


def _all_advice(found: dict[str, dict]) -> str:
    return " ".join(f"{f['detail']} {f['fix']}" for f in found.values())


def test_never_installed_has_no_ok_firmware(pod):
    code, found = doctor(pod)
    assert code == 9
    assert found["gpu_firmware"]["verdict"] == "fail", found["gpu_firmware"]
    assert "no driver installed" in found["gpu_firmware"]["detail"]
    assert "--force" not in _all_advice(found)


def test_after_uninstall_doctor_says_uninstalled_not_killed_or_forced(pod, node):
    ok(pod.run("install"))
    ok(pod.run("uninstall"))
    code, found = doctor(pod)
    assert code == 9
    advice = _all_advice(found)
    assert "--force" not in advice and "killed or failed run" not in advice, advice
    assert "re-run install" not in advice, advice
    for check in ("cache", "install_dir", "gpu_firmware"):
        assert found[check]["verdict"] == "fail", found[check]
        assert found[check]["fix"] == "run install to install it again", found[check]
    assert "uninstalled at" in found["cache"]["detail"]
    assert found["installer_status"]["verdict"] == "warn"


def test_a_staged_version_s_fix_is_the_runbook(pod, kernel):
    ok(pod.run("install"))
    kernel.hold("nvidia")
    ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2, "WHEN_IN_USE": "stage"}))
    _, found = doctor(pod)
    fix = found["installer_status"]["fix"]
    assert fix.startswith("drain the node (kubectl drain <node> --ignore-daemonsets "
                          "--delete-emptydir-data), reboot it, then kubectl uncordon <node>")
    assert "re-run install" not in fix


def _verify_missing(pod) -> str:
    proc = pod.run("verify", "-o", "json")
    assert proc.returncode == 9, proc.stderr[-2000:]
    (line,) = [e for e in events(proc.stderr) if e.get("event") == "verify_failed"]
    return line["error"].split(": ", 1)[1]


@pytest.mark.parametrize("case", ["a GPU's file removed", "after a reboot"])
def test_verify_and_doctor_name_the_same_missing_device_files(pod, kernel, case):
    ok(pod.run("install"))
    if case == "after a reboot":
        kernel.unload_all()
    else:
        (kernel.dev_dir / "nvidia0").unlink()
    named = _verify_missing(pod)
    _, found = doctor(pod)
    assert found["device_nodes"]["verdict"] == "fail"
    assert found["device_nodes"]["detail"].startswith(f"missing: {named} (present:"), (
        named, found["device_nodes"]["detail"])
    assert "/dev/nvidia0" in named
