"""Issue 31 §3: nvidia-persistenced as a sidecar, and readiness that waits for the daemons the
DaemonSet runs (NVIDIA_REQUIRED_DAEMONS, set by `manifests render --persistenced`)."""

from __future__ import annotations

import pytest

from tests.pod import last_event, ok


@pytest.fixture
def persistenced(pod, node, sidecars):
    """The install put the .run's nvidia-persistenced (tests/fixtures/payload/
    nvidia-persistenced.sh) in the install dir, where the sidecar finds it."""
    ok(pod.run("install"))
    assert (node.install_dir / "bin/nvidia-persistenced").is_file()
    return lambda **env: sidecars("persistenced", **env)


def ready(node) -> dict[str, str]:
    text = (node.root / "run/nvidia/validations/driver-ready").read_text()
    return dict(line.split("=", 1) for line in text.splitlines())


def test_ready_waits_for_the_persistenced_sidecar(pod, node, persistenced):
    persistenced()
    ok(pod.run("install", env={"NVIDIA_REQUIRED_DAEMONS": "persistenced"}))
    fields = ready(node)
    assert fields["DAEMONS"] == "persistenced"
    assert fields["CUDA_CHECK"] == "passed" and fields["NVLINK_FABRIC"] == "none"


def test_a_dead_persistenced_is_not_ready_and_says_why(pod, node, persistenced):
    persistenced(FAKE_PERSISTENCED_FAIL="open /dev/nvidiactl: Permission denied")
    proc = pod.run("install", env={"NVIDIA_REQUIRED_DAEMONS": "persistenced"})
    assert proc.returncode == 9, proc.stderr[-3000:]
    error = last_event(proc)["error"]
    assert error.startswith("the persistenced sidecar is not running: persistenced exited "
                            "with status 1: "), error
    assert "open /dev/nvidiactl: Permission denied" in error
    assert not (node.root / "run/nvidia/validations/driver-ready").exists()
