"""`make push` for real (image tier, issue 26): the built images pushed with buildah to
Debian's reference registry (docker-registry, distribution) on 127.0.0.1, then pulled by
the digests images/push.sh printed into an empty storage, and the render command it printed
pinning them.

Skipped unless NDI_IMAGE_TESTS=1 (``make test-images``, which installs docker-registry);
needs root. The images are the image tier's (tests/test_images.py's ``built``): FROM the
local substitute base, as CI cannot reach the real bases' registry.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from installer.commands.manifests import values

# The image tier's build fixture, and its marks (skipped unless NDI_IMAGE_TESTS=1, root).
from tests.test_images import REPO, built, pytestmark  # noqa: F401

REPOSITORY = "ndi"
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json, "
                  "application/vnd.docker.distribution.manifest.v2+json")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def registry(tmp_path):
    """docker-registry serving 127.0.0.1:<port>, its data in tmp_path; stopped after."""
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("docker-registry is not installed: make test-images installs it "
                    "(Debian package docker-registry)")
    port = _free_port()
    config = tmp_path / "registry.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                      f"    rootdirectory: {tmp_path / 'data'}\nhttp:\n"
                      f"  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/v2/", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"docker-registry did not come up: {proc.stderr.read()[-2000:]}")
                time.sleep(0.2)
        yield f"127.0.0.1:{port}", url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _manifest(url: str, name: str, ref: str) -> bytes:
    req = urllib.request.Request(f"{url}/v2/{name}/manifests/{ref}",
                                 headers={"Accept": MANIFEST_TYPES})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


def test_push_then_pull_by_digest(built, registry, tmp_path):  # noqa: F811 - the fixture
    host, url = registry
    env = {**os.environ, "NDI_LOCAL_BASE": "1", "NDI_PUSH_TLS_VERIFY": "false"}
    proc = subprocess.run(["make", "-s", "--no-print-directory", "push",
                           f"REGISTRY={host}/{REPOSITORY}", "TAG=pushed-1"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "local debootstrap substitute" in proc.stderr  # said, since it is not for nodes
    *pushed, render = proc.stdout.strip().splitlines()
    digests = {}
    for line in pushed:
        flavor, ref = line.split()
        match = re.fullmatch(rf"{re.escape(host)}/{REPOSITORY}/nvidia-driver-installer-"
                             rf"{flavor}:pushed-1@(sha256:[a-f0-9]{{64}})", ref)
        assert match, line
        digests[flavor] = match.group(1)
    assert sorted(digests) == sorted(values.IMAGE_FLAVORS)  # one image per image flavour

    pull_root = tmp_path / "pulled"
    for flavor, digest in digests.items():
        name = f"{REPOSITORY}/nvidia-driver-installer-{flavor}"
        # The registry serves exactly those bytes under that digest, and the tag points there.
        body = _manifest(url, name, digest)
        assert "sha256:" + hashlib.sha256(body).hexdigest() == digest
        assert _manifest(url, name, "pushed-1") == body
        # Pulled by digest into an empty storage: the very image that was built.
        bah = ["buildah", "--root", str(pull_root), "--runroot", str(tmp_path / "run")]
        pull = subprocess.run([*bah, "pull", "-q", "--tls-verify=false", f"{host}/{name}@{digest}"],
                              capture_output=True, text=True, timeout=300)
        assert pull.returncode == 0, pull.stderr
        src = subprocess.run(
            ["buildah", "--root", os.environ.get("NDI_BUILDAH_ROOT",
                                                  "/var/cache/ndi-images/storage"),
             "--runroot", os.environ.get("NDI_BUILDAH_RUNROOT", "/run/ndi-images"),
             "inspect", "--type", "image", "--format", "{{.FromImageID}}", built[flavor]],
            capture_output=True, text=True, timeout=60, check=True).stdout.strip()
        assert pull.stdout.strip() == src  # the image ID: its config's digest
    # A digest the registry does not have is refused: the pull above really checked it.
    bad = subprocess.run([*bah, "pull", "-q", "--tls-verify=false",
                          f"{host}/{REPOSITORY}/nvidia-driver-installer-cos@sha256:{'0' * 64}"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0

    # The printed command renders manifests pinned to those digests.
    argv = shlex.split(render)
    assert argv[:3] == ["nvidia-driver-installer", "manifests", "render"]
    out = subprocess.run([sys.executable, "-m", "installer", *argv[1:]], capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    import yaml

    images = {d["metadata"]["name"]: d["spec"]["template"]["spec"]["initContainers"][0]["image"]
              for d in yaml.safe_load_all(out.stdout) if d}
    assert images == {f"nvidia-driver-installer-{flavor}":
                      f"{host}/{REPOSITORY}/nvidia-driver-installer-{flavor}:pushed-1@{digest}"
                      for flavor, digest in digests.items()}
    assert not re.search(r"the (cos|ubuntu) image is pinned by tag only", out.stderr)


def test_push_without_a_registry_is_a_usage_error():
    proc = subprocess.run(["make", "-s", "--no-print-directory", "push"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "usage: make push REGISTRY=" in proc.stderr
    direct = subprocess.run(["bash", str(Path(REPO) / "images/push.sh"), "HTTP://x"],
                            capture_output=True, text=True, timeout=60)
    assert direct.returncode == 2 and "is not a registry path" in direct.stderr
