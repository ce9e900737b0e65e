"""Hostile servers and metadata: URLs from a bucket, credentials in URLs, trickled, encoded
and oversized bodies, bad certificates and redirects.
"""

from __future__ import annotations

import gzip
import os

import pytest

from tests.attacks.conftest import RUN, V, outcome
from tests.fixtures.server import ArtifactServer

pytestmark = pytest.mark.chroot

RUN_PATH = f"/tesla/{V}/{RUN}"


# -- case 5: URLs from remote metadata --------------------------------------------------------


@pytest.mark.parametrize("kind", ["secret_file", "fifo", "other_host"])
def test_toolchain_url_from_the_bucket_cannot_name_host_files_or_other_hosts(cos, tmp_path,
                                                                             kind):
    (tmp_path / "elsewhere").mkdir()
    target = tmp_path / "elsewhere/target"  # seen by the pod, outside the host root
    if kind == "secret_file":
        target.write_text("root's private key\n")
        target.chmod(0o600)
        location = f"file://{target}"
    elif kind == "fifo":
        os.mkfifo(target)
        location = f"file://{target}"
    else:
        location = "https://attacker.example/toolchain.tar.xz"
    cos.bucket.toolchain_via_url = location
    proc = cos.run("install", timeout=120)
    outcome(proc, 6, "refusing the toolchain location")
    cos.assert_host_unchanged()


def test_a_fifo_inside_a_file_bucket_does_not_hang_the_run(cos):
    """A relative toolchain_url is fine, but what it names must be a regular file."""
    cos.bucket.toolchain_via_url = "toolchain.fifo"
    build = cos.bucket.write()
    os.mkfifo(build / "toolchain.fifo")
    cos.pod.env["COS_DOWNLOAD_GCS"] = cos.bucket.file_url()
    proc = cos.run("install", timeout=120)
    outcome(proc, 5, "not a regular file")
    cos.assert_host_unchanged()


# -- case 6: credentials in URLs --------------------------------------------------------------

SECRETS = ("S3cretPassw0rd", "CredSecret123", "SigSecret456")


def _secret_url(base: str, path: str, *, signed: bool = True) -> str:
    """A URL with a password, and (a signed URL names one object) signature parameters."""
    host = base.split("://", 1)[1]
    url = f"https://ndi-bot:{SECRETS[0]}@{host}{path}"
    if signed:
        url += (f"?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential={SECRETS[1]}"
                f"&X-Goog-Signature={SECRETS[2]}")
    return url


def _leaks(world, proc) -> list[str]:
    """Every secret found in the run's output or in any file on the node (install dir,
    status.json, logs, tools cache, ld config ... included)."""
    found = [f"output: {s}" for s in SECRETS if s in proc.stdout + proc.stderr]
    for dirpath, _dirs, files in os.walk(world.node.root):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as f:
                    data = f.read()
                found += [f"{path}: {s}" for s in SECRETS if s.encode() in data]
    return found


@pytest.mark.parametrize("run", ["dry_run", "install", "not_found"])
def test_credentials_in_the_driver_url_never_reach_output_or_files(ubuntu, run):
    path = RUN_PATH if run != "not_found" else "/tesla/999.99.99/NVIDIA-Linux-x86_64-999.99.99.run"
    # over the pod's NVIDIA_DRIVER_BASE_URL: the full URL wins, and the log line saying so
    # names it (redacted) too
    env = {"NVIDIA_DRIVER_DOWNLOAD_URL": _secret_url(ubuntu.server.url, path)}
    if run == "not_found":
        env["NVIDIA_DRIVER_VERSION"] = "999.99.99"
    args = ("install", "--dry-run") if run == "dry_run" else ("install",)
    proc = ubuntu.run(*args, env=env)
    if run == "not_found":
        outcome(proc, 5, "HTTP 404", "X-Goog-Signature=***")
        ubuntu.assert_host_unchanged()
    else:
        outcome(proc, 0)
    assert _leaks(ubuntu, proc) == []


def test_credentials_in_the_cos_artifacts_url_never_reach_output(cos):
    cos.bucket.write()
    cos.bucket.serve(cos.server, prefix="/cos-tools")
    cos.pod.env["COS_DOWNLOAD_GCS"] = _secret_url(cos.server.url, "/cos-tools/{build_id}",
                                                  signed=False)
    proc = cos.run("install", "--dry-run")
    outcome(proc, 0, "dry run")
    assert "driver_version_resolved" in proc.stderr
    assert _leaks(cos, proc) == []


# -- case 7: downloads without an overall deadline --------------------------------------------


def test_a_trickling_server_is_cut_off_at_the_download_deadline(ubuntu):
    ubuntu.server.fault(RUN_PATH, rate=1)  # one byte a second: every read timeout passes
    proc = ubuntu.run("install", env={"DOWNLOAD_DEADLINE": "4"}, timeout=90)
    outcome(proc, 5, "did not finish within its 4s deadline")
    ubuntu.assert_host_unchanged()


def test_a_slow_server_is_cut_off_by_the_minimum_rate(ubuntu):
    ubuntu.server.fault(RUN_PATH, rate=4000)
    proc = ubuntu.run("install", timeout=90, env={
        "DOWNLOAD_MIN_RATE": "100000", "DOWNLOAD_MIN_RATE_TIME": "1", "DOWNLOAD_RETRIES": "2"})
    outcome(proc, 5, "slower than 100000 B/s")
    ubuntu.assert_host_unchanged()


# -- case 8: encoded and oversized bodies ------------------------------------------------------


@pytest.mark.parametrize("body", ["gzip_bomb", "not_gzip"])
def test_content_encoded_bodies_are_refused(ubuntu, body):
    data = gzip.compress(b"\0" * (30 << 20)) if body == "gzip_bomb" else b"plain bytes"
    ubuntu.server.serve(RUN_PATH, data)
    ubuntu.server.fault(RUN_PATH, headers={"Content-Encoding": "gzip"})
    proc = ubuntu.run("install", install_dir_tmpfs="10m")
    outcome(proc, 5, "'gzip'-encoded body")
    ubuntu.assert_host_unchanged()


def test_an_implausible_content_length_is_a_download_error_not_a_full_disk(ubuntu):
    ubuntu.server.fault(RUN_PATH, headers={"Content-Length": str(10**15)})
    proc = ubuntu.run("install", timeout=120)
    outcome(proc, 5, "announced 1000000000000000 bytes")
    ubuntu.assert_host_unchanged()


# -- already held: certificates, redirects, Retry-After ----------------------------------------


def test_an_untrusted_certificate_fails_at_once(ubuntu):
    proc = ubuntu.run("install", env={"REQUESTS_CA_BUNDLE": ""})
    outcome(proc, 5, "certificate")
    ubuntu.assert_host_unchanged()


def test_a_redirect_from_https_to_plain_http_is_refused(ubuntu, driver_run):
    with ArtifactServer(tls=False) as plain:
        plain.serve(RUN_PATH, driver_run.path(V))
        ubuntu.server.fault(RUN_PATH, statuses=[302] * 20,
                            headers={"Location": plain.url_for(RUN_PATH)})
        proc = ubuntu.run("install")
    outcome(proc, 5, "plain http")
    ubuntu.assert_host_unchanged()


def test_a_redirect_loop_ends(ubuntu):
    ubuntu.server.fault(RUN_PATH, statuses=[302] * 100,
                        headers={"Location": ubuntu.server.url_for(RUN_PATH)})
    proc = ubuntu.run("install")
    outcome(proc, 5, "redirects")
    ubuntu.assert_host_unchanged()


def test_a_retry_after_flood_cannot_hold_the_run(ubuntu):
    ubuntu.server.fault(RUN_PATH, statuses=[503] * 100, headers={"Retry-After": "86400"})
    proc = ubuntu.run("install", env={"DOWNLOAD_TIMEOUT": "5"}, timeout=90)
    outcome(proc, 5, "giving up", "503")
    ubuntu.assert_host_unchanged()


# -- issue 22 item 7: the host's ~/.netrc -------------------------------------------------------


@pytest.mark.parametrize("where", ["home", "NETRC"])
def test_the_hosts_netrc_is_never_sent_to_artifact_servers(ubuntu, where):
    """In the pod HOME=/root is the host's root: its .netrc holds the host's credentials,
    not the operator's choice for this download. Proxies and CA bundles still come from
    the environment (the server's CA is trusted through REQUESTS_CA_BUNDLE)."""
    netrc = ubuntu.node.path("/.netrc")
    netrc.write_text("machine 127.0.0.1 login hostuser password HostNetrcS3cret\n"
                     "default login hostuser password HostNetrcS3cret\n")
    netrc.chmod(0o600)
    env = {"HOME": "/root"} if where == "home" else {"NETRC": "/root/.netrc"}
    ubuntu.snapshot()
    proc = ubuntu.run("install", env=env)
    outcome(proc, 0, "installed and verified")
    sent = [(r.method, r.path) for r in ubuntu.server.requests
            if any(k.lower() == "authorization" for k in r.headers)]
    assert ubuntu.server.requests and sent == [], sent
    assert "HostNetrcS3cret" not in proc.stderr + proc.stdout
    ubuntu.assert_host_unchanged(installed=True)
