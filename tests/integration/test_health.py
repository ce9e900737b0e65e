"""Issue 41 items 1-2: the health sidecar beside a finished install on the fixture node.

The pod installs the driver, then runs `sidecar health` as the DaemonSet would (its own
process, the pod's mounts); the test scrapes /metrics and /healthz over 127.0.0.1, writes an
Xid 79 line into the FAKE node's kernel log (tests/fixtures/kernel.py: /dev/kmsg records, a
regular file) and sees the gauge, /healthz, health.json and driver-ready's GPU_HEALTH lines
change within a bounded poll, every line the install wrote in driver-ready kept. The
same text written from user space (facility LOG_USER, as any write to /dev/kmsg gets)
changes nothing."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tests.fixtures import realprometheus
from tests.integration.conftest import V1
from tests.pod import ok

READY = "run/nvidia/validations/driver-ready"  # readiness.READY_HOST_PATH on the fixture node
ALERTS = Path(__file__).parents[2] / "docs/examples/prometheus-alerts.yaml"

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
    ready = node.root / READY
    installed = ready.read_text()
    assert "GPU_HEALTH" not in installed
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
    healthy = installed + "GPU_HEALTH=ok\nGPU_HEALTH_REASON=\n"
    poll(ready.read_text, lambda t: t == healthy, proc)  # the install's lines, then ours

    kernel.kernel_log(XID79, level=4, facility=1)  # a user's write to /dev/kmsg
    time.sleep(4 * INTERVAL_S)
    assert get(base + "/healthz") == (200, "ok\n")
    assert ready.read_text() == healthy

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
    reason = "Xid 79 (PCI:0000:00:04): GPU has fallen off the bus"
    assert poll(ready.read_text, lambda t: "GPU_HEALTH=reboot" in t, proc, deadline_s=10.0) == (
        installed + f"GPU_HEALTH=reboot\nGPU_HEALTH_REASON={reason}\n")
    doc = json.loads((node.install_dir / "daemons/health.json").read_text())
    assert (doc["healthy"], doc["action"], doc["driver_version"]) == (False, "reboot", V1)


def prometheus_config(tmp_path, target: str) -> str:
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {ALERTS}\n"
        "scrape_configs:\n  - job_name: nvidia-driver-installer\n"
        f"    static_configs:\n      - targets: ['{target}']\n")
    return str(config)


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    status, body = get(url)
    assert status == 200, body
    return json.loads(body)["data"]["result"]


def test_a_real_prometheus_scrapes_the_sidecar_and_loads_the_alert_rules(
        pod, node, kernel, sidecars, tmp_path):
    """Debian's prometheus server (tests/fixtures/realprometheus.py) scrapes the sidecar on
    loopback; the install's and the health series come back through its HTTP API, and it
    loads docs/examples/prometheus-alerts.yaml and evaluates every rule without error."""
    binary = realprometheus.prometheus()
    ok(pod.run("install"))
    port, prom_port = free_port(), free_port()
    health = sidecars("health", NVIDIA_METRICS_ADDRESS="127.0.0.1",
                      NVIDIA_METRICS_PORT=str(port), NVIDIA_HEALTH_INTERVAL=str(INTERVAL_S))
    poll(lambda: get(f"http://127.0.0.1:{port}/healthz"), lambda r: r[0] == 200, health)
    prom = subprocess.Popen(
        [str(binary), f"--config.file={prometheus_config(tmp_path, f'127.0.0.1:{port}')}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"),  # noqa: SIM115
        start_new_session=True)
    base = f"http://127.0.0.1:{prom_port}"
    try:
        # Prometheus answers 503 to every API call until its TSDB is open (web/web.go,
        # the ready handler): wait for /-/ready before the first query.
        poll(lambda: get(f"{base}/-/ready"), lambda r: r[0] == 200, prom)
        found = poll(lambda: query(base, "nvidia_driver_installer_success"), bool, prom)
        assert found[0]["metric"]["job"] == "nvidia-driver-installer"
        assert found[0]["value"][1] == "1"
        info = query(base, f'nvidia_driver_installer_info{{driver_version="{V1}"}}')
        assert info and info[0]["metric"]["outcome"] == "ok", info
        assert query(base, "nvidia_driver_installer_health_ok")[0]["value"][1] == "1"
        rules = poll(lambda: json.loads(get(f"{base}/api/v1/rules")[1])["data"]["groups"],
                     lambda g: g and all(r.get("lastEvaluation", "").startswith("2")
                                         and not r["lastEvaluation"].startswith("0001")
                                         for r in g[0]["rules"]), prom)
        assert [r["health"] for r in rules[0]["rules"]] == ["ok"] * len(rules[0]["rules"])
        assert len(rules[0]["rules"]) >= 9
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=30)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait(timeout=30)
