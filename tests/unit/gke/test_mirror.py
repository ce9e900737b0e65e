"""The default .run source: Google's regional mirror on COS (cos-gpu-installer v2's
installerURLTemplate, installer.go L38, zone map L473-486), NVIDIA's host otherwise."""

from __future__ import annotations

import http.server
import threading

import pytest

from installer.distros.cos import mirror
from installer.settings import Settings

V = "535.216.03"


@pytest.mark.parametrize("zone, location", [
    ("projects/123/zones/europe-west4-a", "eu"),
    ("asia-southeast1-b", "asia"),
    ("us-central1-c", "us"),
    ("northamerica-northeast1-a", "us"),  # v2 maps only us/asia/europe
    ("me-west1-a", "us"),
    (None, "us"),
])
def test_zone_picks_the_mirror_bucket(zone, location):
    assert mirror.mirror_base_url(zone) == (
        f"https://storage.googleapis.com/nvidia-drivers-{location}-public/tesla")


def test_v2_url_shape_for_its_own_test_version():
    # installer_test.go L49-57: the us mirror URL for 525.125.06
    assert Settings().driver_run_url("525.125.06", mirror.mirror_base_url(None)) == (
        "https://storage.googleapis.com/nvidia-drivers-us-public/tesla/525.125.06/"
        "NVIDIA-Linux-x86_64-525.125.06.run")


def test_base_url_and_branch_override_the_mirror():
    gke = mirror.mirror_base_url("europe-west1-b")
    assert Settings(driver_base_url="https://m.test/nv").driver_run_url(V, gke) == (
        f"https://m.test/nv/{V}/NVIDIA-Linux-x86_64-{V}.run")
    assert Settings().driver_run_url(V) == (
        f"https://us.download.nvidia.com/tesla/{V}/NVIDIA-Linux-x86_64-{V}.run")
    # GKE's Ubuntu entrypoint.sh L21-23: NVIDIA_DRIVER_BRANCH is the path segment
    assert Settings(driver_branch="XFree86/Linux-x86_64").driver_run_url(V).startswith(
        "https://us.download.nvidia.com/XFree86/Linux-x86_64/")


class _Metadata(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        ok = (self.path == "/computeMetadata/v1/instance/zone"
              and self.headers.get("Metadata-Flavor") == "Google")
        body = b"projects/42/zones/asia-east1-a" if ok else b"no"
        self.send_response(200 if ok else 403)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_zone_comes_from_the_metadata_server(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{server.server_address[1]}")
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # must not be used
        assert mirror.gce_zone() == "projects/42/zones/asia-east1-a"
    finally:
        server.shutdown()


def test_no_metadata_server_means_us(monkeypatch):
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    assert mirror.gce_zone(timeout=1) is None
    assert "-us-public" in mirror.mirror_base_url(mirror.gce_zone(timeout=1))
