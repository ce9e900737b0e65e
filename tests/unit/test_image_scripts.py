"""images/build.sh and images/push.sh (`make images`, `make push`) against a stand-in
`buildah` on PATH: what they print and which storage they push from. The real buildah and a
real registry are the image tier's (tests/test_push.py); this checks the scripts' own logic
in the default run, in seconds.

The stand-in answers the calls the scripts make the way buildah does: ``inspect --type image
NAME`` and ``manifest inspect LIST`` exit 0 only for an image or list in that ``--root``
storage (a list holding amd64 and arm64), ``manifest push --digestfile F`` writes the pushed
list's digest to F, ``pull`` fails (no registry reachable)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from installer import __version__

REPO = Path(__file__).resolve().parents[2]
FAKE_BUILDAH = r"""#!/bin/bash
root=
while [[ $1 == --* ]]; do
  case $1 in --root) root=$2; shift 2 ;; --runroot) shift 2 ;; *) shift ;; esac
done
cmd=$1; shift
[[ $cmd == manifest ]] && { cmd=manifest-$1; shift; }
case $cmd in
  inspect) name=${!#}; [[ -f $root/images/${name//\//_} ]] ;;
  manifest-inspect)
    name=${!#}; [[ -f $root/images/${name//\//_} ]] || exit 125
    echo '{"manifests": [{"platform": {"architecture": "amd64", "os": "linux"}},
                         {"platform": {"architecture": "arm64", "os": "linux"}}]}' ;;
  manifest-push)
    while (($#)); do [[ $1 == --digestfile ]] && digestfile=$2; shift; done
    printf 'sha256:%064d' 7 >"$digestfile" ;;
  *) exit 125 ;;
esac
"""


@pytest.fixture
def images_env(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "buildah").write_text(FAKE_BUILDAH)
    (bindir / "buildah").chmod(0o755)
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NDI_") and k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    env.update(PATH=f"{bindir}:{env['PATH']}", NDI_IMAGE_CACHE=str(cache),
               NDI_BUILDAH_RUNROOT=str(tmp_path / "run"))
    return cache, env


def _built(storage: Path, *flavors: str) -> None:
    (storage / "images").mkdir(parents=True, exist_ok=True)
    for flavor in flavors:
        # The manifest list images/build.sh makes over the architectures' images.
        (storage / "images" / f"localhost_nvidia-driver-installer-{flavor}:{__version__}-list"
         ).touch()


def _make_push(env, *args):
    return subprocess.run(["make", "--no-print-directory", "push", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_push_after_a_substitute_base_build_needs_no_second_build(images_env):
    """`NDI_LOCAL_BASE=1 make images`, then `make push REGISTRY=…` as the README writes it:
    the images are found in the substitute's storage, said to be for tests, and stdout is
    nothing but the pins and the render command (no make echo of the recipe)."""
    cache, env = images_env
    _built(cache / "storage", "cos", "ubuntu")
    proc = _make_push(env, "REGISTRY=127.0.0.1:5000/ndi")
    assert proc.returncode == 0, proc.stderr
    assert "run make images first" not in proc.stderr
    assert "local debootstrap substitute" in proc.stderr
    digest = "sha256:" + f"{7:064d}"
    cos, ubuntu, render = proc.stdout.splitlines()
    assert cos == f"cos 127.0.0.1:5000/ndi/nvidia-driver-installer-cos:{__version__}@{digest}"
    assert ubuntu.startswith("ubuntu 127.0.0.1:5000/ndi/nvidia-driver-installer-ubuntu:")
    assert render.startswith("nvidia-driver-installer manifests render --flavor cos")
    assert "-list (amd64, arm64) to 127.0.0.1:5000/ndi/nvidia-driver-installer-cos:" in proc.stderr


def test_push_prefers_the_real_build(images_env):
    cache, env = images_env
    _built(cache / "storage", "cos", "ubuntu")
    _built(cache / "storage-real", "cos", "ubuntu")
    proc = _make_push(env, "REGISTRY=127.0.0.1:5000/ndi")
    assert proc.returncode == 0, proc.stderr
    assert "substitute" not in proc.stderr


def test_push_with_nothing_built_says_make_images(images_env):
    _, env = images_env
    proc = _make_push(env, "REGISTRY=127.0.0.1:5000/ndi")
    assert proc.returncode == 2
    assert "run make images first" in proc.stderr and proc.stdout == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="images/build.sh refuses to run without root")
def test_build_names_the_real_dockerfiles_when_a_base_cannot_be_pulled(images_env):
    _, env = images_env
    # This machine's architecture only: no qemu-user-static install or binfmt registration.
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()
    proc = subprocess.run(["bash", str(REPO / "images/build.sh")],
                          env={**env, "NDI_IMAGE_ARCHES": arch},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    # The first base the Dockerfiles name, read past the build stage's
    # `FROM --platform=$BUILDPLATFORM $BUILD_BASE` (its ARG's default).
    assert f"pulling the base docker.io/library/debian:12-slim for {arch} ..." in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "cannot pull the base image" in line
    assert "images/cos/Dockerfile images/ubuntu/Dockerfile" in line, line
    assert "{" not in line


@pytest.mark.skipif(os.geteuid() != 0, reason="images/build.sh refuses to run without root")
@pytest.mark.parametrize(("arches", "said"), [
    ("amd64 riscv64",
     "NDI_IMAGE_ARCHES names 'riscv64': the architectures are amd64 arm64 (Debian's names)"),
    ("arm64 arm64", "NDI_IMAGE_ARCHES names an architecture twice: arm64 arm64"),
    (" ", "NDI_IMAGE_ARCHES is empty (architectures: amd64 arm64)"),
])
def test_build_refuses_an_unknown_architecture_before_any_work(images_env, arches, said):
    cache, env = images_env
    proc = subprocess.run(["bash", str(REPO / "images/build.sh")],
                          env={**env, "NDI_IMAGE_ARCHES": arches},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"[images] error: {said}"]
    assert not cache.exists()  # nothing built, pulled or installed first
