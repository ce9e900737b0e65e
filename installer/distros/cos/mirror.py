"""Where the NVIDIA ``.run`` comes from by default.

On COS the default is Google's regional public mirror of NVIDIA's files, the
buckets cos-gpu-installer v2 downloads from (cos/tools
``src/cmd/cos_gpu_installer/internal/installer/installer.go``:
``installerURLTemplate`` L38, the zone -> location map L473-486): reachable from
private clusters through Private Google Access, where NVIDIA's host is not.
COS runs only on Google Compute Engine, so a COS host is always on Google's
network; Ubuntu nodes may be anywhere (GKE's own Ubuntu installer downloads
from NVIDIA), so they keep NVIDIA's host.
"""

from __future__ import annotations

import os
import urllib.request

import structlog

log = structlog.get_logger(__name__)

MIRROR_BASE = "https://storage.googleapis.com/nvidia-drivers-{location}-public/tesla"
# The first field of a GCE zone ("europe-west4-a") -> the mirror bucket's location.
_LOCATIONS = {"us": "us", "asia": "asia", "europe": "eu"}
# The metadata server's fixed address (no DNS lookup, which a timeout would not bound);
# GCE_METADATA_HOST is the override Google's client libraries honour.
METADATA_HOST = "169.254.169.254"
METADATA_TIMEOUT_S = 2.0


def location_for_zone(zone: str | None) -> str:
    """``projects/1/zones/europe-west4-a`` -> ``eu``; unknown or none -> ``us`` (as v2)."""
    name = (zone or "").rsplit("/", 1)[-1]
    return _LOCATIONS.get(name.split("-", 1)[0], "us")


def mirror_base_url(zone: str | None) -> str:
    return MIRROR_BASE.format(location=location_for_zone(zone))


def gce_zone(timeout: float = METADATA_TIMEOUT_S) -> str | None:
    """This VM's zone from the GCE metadata server, or None when it does not answer."""
    host = os.environ.get("GCE_METADATA_HOST") or METADATA_HOST
    request = urllib.request.Request(
        f"http://{host}/computeMetadata/v1/instance/zone", headers={"Metadata-Flavor": "Google"})
    # Never through a proxy: the metadata server is link-local.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.read(256).decode("ascii", "replace").strip() or None
    except (OSError, ValueError) as exc:
        log.info("gce_zone_unknown", reason=str(exc), using="the us mirror")
        return None
