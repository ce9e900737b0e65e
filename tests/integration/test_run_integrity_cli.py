"""A proxy's HTML page served as the .run: exit 6, one sentence naming it, no shell errors."""

from __future__ import annotations

import pytest

from tests.integration.conftest import V1
from tests.pod import events

pytestmark = pytest.mark.chroot

V = V1
RUN = f"NVIDIA-Linux-x86_64-{V}.run"
PAGE = "<!DOCTYPE html>\n<html><body><h1>Proxy authentication required</h1></body></html>\n"


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_an_html_page_for_the_run_is_an_integrity_failure(node, pod, server, log_format):
    server.serve(f"/tesla/{V}/{RUN}", PAGE, content_type="text/html")
    proc = pod.run("install", env={"LOG_FORMAT": log_format})
    assert proc.returncode == 6, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Syntax error" not in proc.stderr
    sentence = (f"FAILED in step extract_driver (integrity, exit 6): {RUN} is not an NVIDIA "
                "installer (starts with: '<!DOCTYPE html> <html><body><h1>Proxy au…'). What to "
                "do: the server sent something else (a proxy's HTML page, an error, a cut-off "
                "download): check --driver-url and the proxy, then re-run.")
    if log_format == "json":
        assert events(proc.stderr)[-1]["message"] == sentence
    else:
        assert proc.stderr.rstrip().splitlines()[-1] == sentence
    assert not (node.install_dir / "drivers").exists()


CUT_HINT = ("the server sent something else (a proxy's HTML page, an error, a cut-off "
            "download): check --driver-url and the proxy, then re-run")


@pytest.mark.parametrize(("keep", "said"), [
    (3000, f"{RUN} is not an NVIDIA installer (its makeself header is cut off after 134 of 720 "
           f"lines). What to do: {CUT_HINT}."),
    (-5000, "the driver package is corrupt: Verifying archive integrity... Unexpected archive "
            "size. What to do: the download was damaged or truncated: re-run to download it "
            "again."),
])
def test_a_cut_off_run_is_an_integrity_failure(pod, server, driver_runs, keep, said):
    whole = driver_runs[V].read_bytes()
    server.serve(f"/tesla/{V}/{RUN}", whole[:keep])
    proc = pod.run("install")
    assert proc.returncode == 6, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert events(proc.stderr)[-1]["message"] == (
        f"FAILED in step extract_driver (integrity, exit 6): {said}")
