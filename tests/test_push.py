"""`make push` for real (image tier, issues 26 and 42): the built images pushed with buildah,
one manifest list per flavour over its amd64 and arm64 images, to Debian's reference
registry (docker-registry, distribution) on 127.0.0.1; each list then pulled back by the
digest images/push.sh printed, once per architecture, into an empty storage; the arm64
image's installer run under qemu-user; and the render command it printed pinning the lists.

Skipped unless NDI_IMAGE_TESTS=1 (``make test-images``, which installs docker-registry and
qemu-user-static); needs root. The images are the image tier's (tests/test_images.py's
``built``): FROM the local substitute base, as CI cannot reach the real bases' registry.
"""

from __future__ import annotations

import hashlib
import json
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
from tests.test_images import REPO, Image, ImagePod, buildah, built, pytestmark  # noqa: F401

REPOSITORY = "ndi"
ARCHES = ("amd64", "arm64")
LIST_TYPES = ("application/vnd.oci.image.index.v1+json",
              "application/vnd.docker.distribution.manifest.list.v2+json")
IMAGE_TYPES = ("application/vnd.oci.image.manifest.v1+json",
               "application/vnd.docker.distribution.manifest.v2+json")
ACCEPT = ", ".join(LIST_TYPES + IMAGE_TYPES)
ELF_MACHINE = {"amd64": 62, "arm64": 183}  # e_machine: EM_X86_64, EM_AARCH64 (elf.h)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """docker-registry serving 127.0.0.1:<port>, its data in a temp dir; stopped after."""
    tmp_path = tmp_path_factory.mktemp("registry")
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


def _get(url: str, path: str) -> bytes:
    req = urllib.request.Request(f"{url}/v2/{path}", headers={"Accept": ACCEPT})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


def _sha256(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


@pytest.fixture(scope="module")
def pushed(built, registry):  # noqa: F811 - the fixture
    """`make push` of the built lists: (host, url, {flavor: list digest}, render line)."""
    host, url = registry
    env = {**os.environ, "NDI_LOCAL_BASE": "1", "NDI_PUSH_TLS_VERIFY": "false"}
    proc = subprocess.run(["make", "-s", "--no-print-directory", "push",
                           f"REGISTRY={host}/{REPOSITORY}", "TAG=pushed-1"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "local debootstrap substitute" in proc.stderr  # said, since it is not for nodes
    *lines, render = proc.stdout.strip().splitlines()
    digests = {}
    for line in lines:
        flavor, ref = line.split()
        match = re.fullmatch(rf"{re.escape(host)}/{REPOSITORY}/nvidia-driver-installer-"
                             rf"{flavor}:pushed-1@(sha256:[a-f0-9]{{64}})", ref)
        assert match, line
        digests[flavor] = match.group(1)
    assert sorted(digests) == sorted(values.IMAGE_FLAVORS)  # one list per image flavour
    return host, url, digests, render


def _index(url: str, flavor: str, digest: str) -> dict:
    name = f"{REPOSITORY}/nvidia-driver-installer-{flavor}"
    body = _get(url, f"{name}/manifests/{digest}")
    assert _sha256(body) == digest  # the registry serves exactly those bytes
    assert _get(url, f"{name}/manifests/pushed-1") == body  # and the tag points there
    index = json.loads(body)
    assert index["mediaType"] in LIST_TYPES, index.get("mediaType")
    return index


def test_make_push_pushes_one_list_per_flavor_with_both_architectures(pushed):
    _, url, digests, _ = pushed
    for flavor, digest in digests.items():
        index = _index(url, flavor, digest)
        name = f"{REPOSITORY}/nvidia-driver-installer-{flavor}"
        platforms = [(m["platform"]["os"], m["platform"]["architecture"])
                     for m in index["manifests"]]
        assert sorted(platforms) == [("linux", arch) for arch in ARCHES]
        for entry in index["manifests"]:
            # Each entry's image is in the registry, and its config says the entry's
            # architecture: the list does not just label one image twice.
            body = _get(url, f"{name}/manifests/{entry['digest']}")
            assert _sha256(body) == entry["digest"]
            manifest = json.loads(body)
            assert manifest["mediaType"] in IMAGE_TYPES
            config = json.loads(_get(url, f"{name}/blobs/{manifest['config']['digest']}"))
            assert (config["os"], config["architecture"]) == ("linux",
                                                              entry["platform"]["architecture"])


@pytest.fixture(scope="module")
def pulled(pushed, tmp_path_factory):
    """{(flavor, arch): image ID}: each list pulled by its digest with --arch into an empty
    storage, as a node of that architecture pulls it."""
    host, _, digests, _ = pushed
    root = tmp_path_factory.mktemp("pulled")
    bah = ["buildah", "--root", str(root / "storage"), "--runroot", str(root / "run")]
    ids = {}
    for flavor, digest in digests.items():
        for arch in ARCHES:
            pull = subprocess.run([*bah, "pull", "-q", "--tls-verify=false", "--arch", arch,
                                   f"{host}/{REPOSITORY}/nvidia-driver-installer-{flavor}@{digest}"],
                                  capture_output=True, text=True, timeout=600)
            assert pull.returncode == 0, pull.stderr
            ids[flavor, arch] = pull.stdout.strip()
    return bah, ids


def test_each_architecture_pulls_back_through_the_lists_digest(pulled):
    bah, ids = pulled
    for (flavor, arch), image_id in ids.items():
        pulled_arch = subprocess.run([*bah, "inspect", "--type", "image", "--format",
                                      "{{.OCIv1.Architecture}}", image_id], capture_output=True,
                                     text=True, timeout=60, check=True).stdout.strip()
        assert pulled_arch == arch, (flavor, arch)
        # The very image built for that architecture (the image ID: its config's digest).
        local = f"localhost/nvidia-driver-installer-{flavor}:{values.image_tag()}-{arch}"
        built_id = buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}",
                           local).stdout.strip()
        assert image_id == built_id, (flavor, arch)
    # Two architectures, two different images per flavour.
    assert len(set(ids.values())) == len(ids)


def _resolve(rootfs: Path, path: str) -> Path:
    """PATH inside ROOTFS with its symlinks followed there, not on this machine."""
    for _ in range(16):
        full = rootfs / path.lstrip("/")
        if not full.is_symlink():
            return full
        target = os.readlink(full)
        path = target if target.startswith("/") else os.path.join(os.path.dirname(path), target)
        path = os.path.normpath(path)
    raise AssertionError(f"symlink loop at {path} in {rootfs}")


def test_the_arm64_installer_runs_under_qemu_user(pulled):
    """The pulled arm64 image's own Python (an AArch64 ELF) runs the installer's CLI through
    binfmt_misc's qemu-aarch64 (qemu-user-static), as an arm64 node would run it natively."""
    bah, ids = pulled
    for flavor in values.IMAGE_FLAVORS:
        image_id = ids[flavor, "arm64"]
        ctr = subprocess.run([*bah, "from", "--pull-never", image_id], capture_output=True,
                             text=True, timeout=120, check=True).stdout.strip()
        try:
            rootfs = Path(subprocess.run([*bah, "mount", ctr], capture_output=True, text=True,
                                         timeout=60, check=True).stdout.strip())
            # The venv's python: links to the image's own interpreter.
            interpreter = _resolve(rootfs, "/opt/nvidia-driver-installer/bin/python")
            header = interpreter.read_bytes()[:20]
            assert header[:4] == b"\x7fELF"
            assert int.from_bytes(header[18:20], "little") == ELF_MACHINE["arm64"], interpreter
            config = json.loads(subprocess.run(
                [*bah, "inspect", "--type", "image", image_id], capture_output=True, text=True,
                timeout=60, check=True).stdout)["OCIv1"]["config"]
            proc = ImagePod(Image(image_id, rootfs, config), rootfs, mounts=[]).run("--help")
            assert proc.returncode == 0, proc.stderr[-2000:]
            for command in ("install", "detect", "manifests"):
                assert command in proc.stdout
        finally:
            subprocess.run([*bah, "umount", ctr], capture_output=True, timeout=60)
            subprocess.run([*bah, "rm", ctr], capture_output=True, timeout=60)


VENV = "opt/nvidia-driver-installer"
TRIPLET = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}


def _venv_files(rootfs: Path, arch: str) -> tuple[set[str], dict[str, int]]:
    """(every path in the image's venv, the architecture's triplet in extension module
    names made neutral; {path: ELF e_machine} of its machine code). Symlinks are not
    followed: the venv's python links to the image's own interpreter."""
    venv = rootfs / VENV
    paths, elfs = set(), {}
    for path in venv.rglob("*"):
        rel = str(path.relative_to(venv))
        paths.add(rel.replace(TRIPLET[arch], "<triplet>"))
        if path.is_file() and not path.is_symlink():
            with path.open("rb") as f:
                header = f.read(20)
            if header[:4] == b"\x7fELF":
                elfs[rel] = int.from_bytes(header[18:20], "little")
    return paths, elfs


def test_the_arm64_venv_is_the_amd64_ones_install_with_aarch64_machine_code(pulled):
    """The arm64 venv is made on the build machine's architecture (the Dockerfiles' build
    stage, FROM --platform=$BUILDPLATFORM) with the arm64 wheels: the same installed files
    as the amd64 image's (pip's dist-infos, scripts, modules), and every extension module
    an AArch64 ELF (x86-64 wheels there would import on no arm64 node)."""
    bah, ids = pulled
    for flavor in values.IMAGE_FLAVORS:
        files = {}
        for arch in ARCHES:
            ctr = subprocess.run([*bah, "from", "--pull-never", ids[flavor, arch]],
                                 capture_output=True, text=True, timeout=120,
                                 check=True).stdout.strip()
            try:
                rootfs = Path(subprocess.run([*bah, "mount", ctr], capture_output=True,
                                             text=True, timeout=60, check=True).stdout.strip())
                files[arch] = _venv_files(rootfs, arch)
            finally:
                subprocess.run([*bah, "umount", ctr], capture_output=True, timeout=60)
                subprocess.run([*bah, "rm", ctr], capture_output=True, timeout=60)
        (amd64_paths, amd64_elfs), (arm64_paths, arm64_elfs) = files["amd64"], files["arm64"]
        assert amd64_paths == arm64_paths, (flavor, sorted(amd64_paths ^ arm64_paths)[:20])
        dists = sorted(p.rsplit("/", 1)[1] for p in arm64_paths
                       if p.endswith(".dist-info") and "/site-packages/" in p)
        assert any(d.startswith("zstandard-") for d in dists), dists  # a compiled dependency
        assert any(d.startswith("nvidia_driver_installer-") for d in dists), dists
        assert arm64_elfs and set(arm64_elfs.values()) == {ELF_MACHINE["arm64"]}, arm64_elfs
        assert set(amd64_elfs.values()) == {ELF_MACHINE["amd64"]}, amd64_elfs


def test_a_digest_the_registry_lacks_is_refused(pushed, tmp_path):
    host = pushed[0]
    bah = ["buildah", "--root", str(tmp_path / "storage"), "--runroot", str(tmp_path / "run")]
    bad = subprocess.run([*bah, "pull", "-q", "--tls-verify=false",
                          f"{host}/{REPOSITORY}/nvidia-driver-installer-cos@sha256:{'0' * 64}"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0


def test_the_printed_render_command_pins_the_lists(pushed):
    host, _, digests, render = pushed
    argv = shlex.split(render)
    assert argv[:3] == ["nvidia-driver-installer", "manifests", "render"]
    out = subprocess.run([sys.executable, "-m", "installer", *argv[1:]], capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    import yaml

    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    images = {d["metadata"]["name"]: d["spec"]["template"]["spec"]["initContainers"][0]["image"]
              for d in docs}
    # One DaemonSet per flavour, no per-architecture variant, none held to one architecture:
    # the list serves both.
    assert all("kubernetes.io/arch" not in json.dumps(d["spec"]["template"]["spec"].get(key))
               for d in docs for key in ("affinity", "nodeSelector"))
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
