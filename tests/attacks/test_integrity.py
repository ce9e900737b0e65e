"""Integrity of what runs as root: unpinned drivers said out loud, COS artifacts pinned by a
manifest, and the .run's own shell header (cases 13 and 14).
"""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.attacks.conftest import RUN, V_OLD, V, event_names, outcome
from tests.pod import events

pytestmark = pytest.mark.chroot

BIG = ("kernel-headers.tgz", "toolchain.tar.xz", ".run")


# -- case 13: pinning ----------------------------------------------------------------------------


def test_an_unpinned_driver_is_warned_about_and_a_pinned_one_is_not(ubuntu, driver_run):
    proc = ubuntu.run("install")
    outcome(proc, 0, "installed and verified")
    warned = [e for e in events(proc.stderr) if e.get("event") == "artifacts_unpinned"]
    assert len(warned) == 1 and "--driver-sha256" in warned[0]["message"]
    proc = ubuntu.run("install", "--force", "--driver-sha256", driver_run.sha256(V))
    outcome(proc, 0, "installed and verified")
    assert "artifacts_unpinned" not in event_names(proc)
    ubuntu.assert_host_unchanged(installed=True)


def _manifest(build, tmp_path, *, drop: str | None = None, wrong: str | None = None,
              runs=None) -> str:
    """sha256sum of the build's files (as a vetting step would write it), plus the NVIDIA
    .runs of ``runs`` (a DriverRuns: the .run is pinned by the manifest too)."""
    lines = [f"{runs.sha256(v)}  NVIDIA-Linux-x86_64-{v}.run" for v in (V, V_OLD)] if runs else []
    for path in sorted(p for p in build.rglob("*") if p.is_file()):
        rel = path.relative_to(build).as_posix()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if rel == drop:
            continue
        if rel == wrong:
            digest = "0" * 64
        lines.append(f"{digest}  {rel}")
    out = tmp_path / "SHA256SUMS"
    out.write_text("\n".join(lines) + "\n")
    return str(out)


def _big_gets(server) -> list[str]:
    return [r.path for r in server.requests if r.method == "GET" and r.path.endswith(BIG)]


@pytest.mark.parametrize("where", ["file", "url"])
def test_cos_artifacts_pinned_by_a_manifest_are_verified(cos, tmp_path, where, driver_run):
    manifest = _manifest(cos.bucket.write(), tmp_path, runs=driver_run)
    if where == "url":
        manifest = cos.server.serve("/vetted/SHA256SUMS", tmp_path / "SHA256SUMS")
    proc = cos.run("install", env={"COS_ARTIFACTS_SHA256": manifest})
    outcome(proc, 0, "installed and verified")
    pinned = {e["label"]: e["expected_sha256"] for e in events(proc.stderr)
              if e.get("event") == "download_started"}
    assert pinned["kernel headers"] and pinned["toolchain"] and pinned["driver"], pinned
    assert "artifacts_unpinned" not in event_names(proc)
    marker = cos.node.path("/var/lib/cos-tools/17801.218.41/toolchain/"
                           ".nvidia-driver-installer.json")
    assert json.loads(marker.read_text())["sha256"] == pinned["toolchain"]
    cos.assert_host_unchanged(installed=True)


def test_a_cos_artifact_that_does_not_match_its_pin_is_exit_6(cos, tmp_path, driver_run):
    manifest = _manifest(cos.bucket.write(), tmp_path, wrong="kernel-headers.tgz",
                         runs=driver_run)
    proc = cos.run("install", env={"COS_ARTIFACTS_SHA256": manifest})
    outcome(proc, 6, "sha256 mismatch", "kernel-headers.tgz")
    cos.assert_host_unchanged()


def test_a_cos_artifact_the_manifest_does_not_list_is_refused_before_any_download(cos, tmp_path,
                                                                                  driver_run):
    manifest = _manifest(cos.bucket.write(), tmp_path, drop="toolchain.tar.xz", runs=driver_run)
    proc = cos.run("install", env={"COS_ARTIFACTS_SHA256": manifest})
    outcome(proc, 6, "not pinned by the COS artifacts manifest", "toolchain.tar.xz")
    assert _big_gets(cos.server) == []
    cos.assert_host_unchanged()


# Issue 22 item 2: what a manifest does not list is not read, whatever the build serves.
EVIL_ENV = "CC=/bin/sh -c 'id > /tmp/pwned-by-toolchain-env'\nCXX=x86_64-cos-linux-gnu-g++\n"


@pytest.mark.parametrize("dry", [False, True], ids=["install", "dry_run"])
@pytest.mark.parametrize("unlisted", ["toolchain_env", "gpu_default_version", "toolchain_url"])
def test_a_build_file_the_manifest_does_not_list_is_not_read(cos, tmp_path, driver_run, unlisted,
                                                            dry):
    """Metadata the manifest leaves out steers what runs as root (the compiler, the driver
    version, where the toolchain comes from): exit 6 before any download, naming it."""
    if unlisted == "toolchain_url":
        cos.bucket.toolchain_via_url = "toolchain-elsewhere.tar.xz"
    build = cos.bucket.write()
    if unlisted == "toolchain_url":
        (build / "toolchain-elsewhere.tar.xz").write_bytes(
            (cos.bucket.root / "toolchain-elsewhere.tar.xz").read_bytes())
    manifest = _manifest(build, tmp_path, drop=unlisted, runs=driver_run)
    # Tampered after vetting: the manifest never saw these.
    if unlisted == "toolchain_env":
        (build / "toolchain_env").write_text(EVIL_ENV)
    elif unlisted == "gpu_default_version":
        (build / "gpu_default_version").write_text(V + "\n")  # vetted .run, unvetted choice
    proc = cos.run("install", *(["--dry-run"] if dry else []),
                   env={"COS_ARTIFACTS_SHA256": manifest})
    outcome(proc, 6, "not pinned by the COS artifacts manifest", unlisted)
    assert _big_gets(cos.server) == []
    assert not [r for r in cos.server.requests
                if r.method == "GET" and r.path.endswith("/" + unlisted)], "read anyway"
    cos.assert_host_unchanged()


def test_a_driver_run_the_manifest_does_not_list_is_refused_before_any_download(cos, tmp_path):
    """With a manifest, NVIDIA's .run is pinned like the rest (not merely looked up)."""
    manifest = _manifest(cos.bucket.write(), tmp_path)
    proc = cos.run("install", env={"COS_ARTIFACTS_SHA256": manifest})
    outcome(proc, 6, "not pinned by the COS artifacts manifest", ".run")
    assert _big_gets(cos.server) == []
    cos.assert_host_unchanged()


@pytest.mark.parametrize("dry", [False, True], ids=["install", "dry_run"])
@pytest.mark.parametrize("line", [
    "CC=/bin/sh -c 'id > /tmp/pwned-by-toolchain-env'",
    "CC=x86_64-cos-linux-gnu-gcc -wrapper /bin/sh",
    "KCFLAGS=-wrapper /tmp/pwned-by-toolchain-env",
    "HOSTCC=gcc;id>/tmp/pwned-by-toolchain-env",
    "CXX=$(id>/tmp/pwned-by-toolchain-env)",
    "LD=/usr/bin/ld",
    "CC=--help=x",
    "PATH=/tmp",
])
def test_toolchain_env_names_only_tools_of_the_toolchain(cos, line, dry):
    """Without a manifest too: toolchain_env may only name the toolchain's own tools."""
    key = line.split("=", 1)[0]
    good = {"CC": "x86_64-cos-linux-gnu-gcc", "CXX": "x86_64-cos-linux-gnu-g++"}
    cos.bucket.toolchain_env = "".join(f"{k}={v}\n" for k, v in good.items() if k != key) + line
    proc = cos.run("install", *(["--dry-run"] if dry else []))
    outcome(proc, 6, "toolchain_env", key)
    assert _big_gets(cos.server) == []
    assert not cos.node.path("/tmp/pwned-by-toolchain-env").exists()
    cos.assert_host_unchanged()


# -- case 14: the .run's shell header -------------------------------------------------------------

EVIL_HEADER_RUN = """#!/bin/sh
# A .run whose makeself header does more than extract: it writes where it can. It names
# makeself's variables, so it passes the installer's header check and really runs.
CRCsum="0"
label="NVIDIA Accelerated Graphics Driver for Linux-x86_64"
skip="1"
echo pwned > {target}
exit 1
"""


def test_the_run_files_shell_header_is_extracted_inside_the_sandbox(ubuntu):
    """Whatever the .run's header does while extracting must not reach the container (or
    the host): unpinned, it is NVIDIA's code running as root, but not outside a sandbox."""
    target = ubuntu.canary / "written-by-the-run-header"
    ubuntu.server.serve(f"/tesla/{V}/{RUN}", EVIL_HEADER_RUN.format(target=target))
    proc = ubuntu.run("install")
    assert proc.returncode in (6, 7), proc.stderr[-3000:]
    assert not target.exists()
    ubuntu.assert_host_unchanged()
