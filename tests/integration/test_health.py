"""Issue 41 items 1-2: the health sidecar beside a finished install on the fixture node.

The pod installs the driver, then runs `sidecar health` as the DaemonSet would (its own
process, the pod's mounts); the test scrapes /metrics and /healthz over 127.0.0.1, writes an
Xid 79 line into the FAKE node's kernel log (tests/fixtures/kernel.py: /dev/kmsg records, a
regular file) and sees the gauge, /healthz and health.json change within a bounded poll. The
same text written from user space (facility LOG_USER, as any write to /dev/kmsg gets)
changes nothing."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

from tests.integration.conftest import V1
from tests.pod import ok

XID79 = "NVRM: Xid (PCI:0000:00:04): 79, GPU has fallen off the bus."  # kernel_rc.c's format
INTERVAL_S = 0.5
DEADLINE_S = 60.0  # the pod's start (python, unshare) and a few checks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def poll(what, until, proc, deadline_s: float = DEADLINE_S):
    """``what()`` until ``until(it)`` holds, at most ``deadline_s``; the last value."""
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate(timeout=10)[1][-3000:]
        try:
            last = what()
        except OSError as exc:  # not listening yet
            last = exc
        if not isinstance(last, Exception) and until(last):
            return last
        time.sleep(0.2)
    raise AssertionError(f"not within {deadline_s:g}s: {last!r}")


def gauge(text: str, sample: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return line.rsplit(" ", 1)[1]
    return None


def test_xid_79_in_the_kernel_log_turns_the_node_unhealthy_within_seconds(
        pod, node, kernel, sidecars):
    ok(pod.run("install"))
    port = free_port()
    proc = sidecars("health", NVIDIA_METRICS_ADDRESS="127.0.0.1",
                    NVIDIA_METRICS_PORT=str(port), NVIDIA_HEALTH_INTERVAL=str(INTERVAL_S))
    base = f"http://127.0.0.1:{port}"
    assert poll(lambda: get(base + "/healthz"), lambda r: r[0] == 200, proc) == (200, "ok\n")
    status, text = get(base + "/metrics")
    assert status == 200
    assert gauge(text, "nvidia_driver_installer_success") == "1"  # the install's own series
    assert f'driver_version="{V1}"' in text and "plan=" in text
    assert gauge(text, "nvidia_driver_installer_health_ok") == "1"
    assert gauge(text, 'nvidia_driver_installer_health_action{action="none"}') == "1"
    assert gauge(text, "nvidia_driver_installer_health_gpus_present") == "1"

    kernel.kernel_log(XID79, level=4, facility=1)  # a user's write to /dev/kmsg
    time.sleep(4 * INTERVAL_S)
    assert get(base + "/healthz") == (200, "ok\n")

    started = time.monotonic()
    kernel.kernel_log(XID79, level=3)  # the driver's own record
    status, body = poll(lambda: get(base + "/healthz"), lambda r: r[0] == 503, proc,
                        deadline_s=10.0)
    assert time.monotonic() - started < 10.0
    assert body == "action reboot: Xid 79 (PCI:0000:00:04): GPU has fallen off the bus\n"
    text = get(base + "/metrics")[1]
    assert gauge(text, "nvidia_driver_installer_health_ok") == "0"
    assert gauge(text, 'nvidia_driver_installer_health_action{action="reboot"}') == "1"
    assert gauge(text, 'nvidia_driver_installer_health_xid_events{code="79",action="reboot"}'
                 ) == "1"
    doc = json.loads((node.install_dir / "daemons/health.json").read_text())
    assert (doc["healthy"], doc["action"], doc["driver_version"]) == (False, "reboot", V1)
