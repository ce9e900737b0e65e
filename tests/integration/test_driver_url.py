"""Where the .run comes from when a full URL and a base URL are both set (issue 34 §2).

GKE's installers take a full NVIDIA_DRIVER_DOWNLOAD_URL over the base URL, and operators
set a pool's full URL over a DaemonSet template's base URL: the full URL wins and one log
line says the base URL was not used. Only two flags that disagree are refused."""

from __future__ import annotations

import pytest

from tests.integration.conftest import V1
from tests.pod import events, last_event, ok

pytestmark = pytest.mark.chroot

RUN = f"/tesla/{V1}/NVIDIA-Linux-x86_64-{V1}.run"
UNREACHABLE_BASE = "https://127.0.0.1:9/not-used"  # discard port: nothing answers


def _not_used(proc) -> list[dict]:
    return [e for e in events(proc.stderr) if e.get("event") == "driver_base_url_not_used"]


@pytest.mark.parametrize("url_as", ["env", "flag"])
def test_a_full_url_wins_over_a_base_url_from_the_env(pod, server, url_as):
    url = f"{server.url}{RUN}"
    env = {"NVIDIA_DRIVER_BASE_URL": UNREACHABLE_BASE}
    args = ["install"]
    if url_as == "env":
        env["NVIDIA_DRIVER_DOWNLOAD_URL"] = url
    else:
        args += ["--driver-url", url]
    proc = ok(pod.run(*args, env=env))
    assert last_event(proc)["plan"] == "fresh"
    (line,) = _not_used(proc)
    assert (line["driver_url"], line["driver_base_url"]) == (url, UNREACHABLE_BASE)
    assert [r.path for r in server.requests] == [RUN]


def test_two_flags_that_disagree_are_refused(pod, server):
    proc = pod.run("install", "--driver-url", f"{server.url}{RUN}",
                   "--driver-base-url", UNREACHABLE_BASE)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--driver-url and --driver-base-url both name where the .run comes from" in \
        last_event(proc)["message"]
    assert server.requests == []


def test_a_base_url_alone_logs_nothing_about_it(pod, server):
    proc = ok(pod.run("install"))
    assert _not_used(proc) == []
