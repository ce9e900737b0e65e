"""Bundles end to end (issue 15): ``bundle build`` -> ``bundle index`` -> ``install
--prebuilt-url``, each run as the pod runs the CLI, against fixture nodes.

Real: the fixture .run and its nvidia-installer building (fake) modules in the
sandbox, the bundle archive, the HTTPS server, ldconfig, the staged promote.
"No compiler run" is: no nvidia_installer_started event (the one place the
build starts) and no nvidia-installer.log in the install dir.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.fixtures.kernel import FakeKernel
from tests.fixtures.node import build_ubuntu_node
from tests.pod import Pod, events

pytestmark = pytest.mark.chroot

V = "550.54.14"
RELEASE, OTHER = "5.15.0-1049-gke", "6.8.0-1015-gke"
NAME = f"nvidia-driver-{V}-proprietary-{RELEASE}.tar.zst"
OTHER_NAME = f"nvidia-driver-{V}-proprietary-{OTHER}.tar.zst"
OUT = "/srv/bundles"  # under the build node's root: what the pod writes there stays


def last_event(proc) -> dict:
    return [e for e in events(proc.stderr) if "event" in e][-1]


def ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def compiled(proc) -> bool:
    """Whether the run started nvidia-installer (the build)."""
    return "nvidia_installer_started" in [e.get("event") for e in events(proc.stderr)]


def build_bundle(work, server, release: str, *args: str, out: str = f"/root{OUT}",
                 setup=None):
    """``bundle build`` for ``release`` in the pod of a fresh build node (whose own kernel
    is RELEASE); ``setup(node)`` runs first. Returns (node, kernel, its JSON, compiled)."""
    node = build_ubuntu_node(work / f"node-{release}", kernel_release=release)
    if setup:
        setup(node)
    kernel = FakeKernel(work / f"kernel-{release}", RELEASE)  # the build machine's kernel
    pod = Pod(node_root=node.root, install_dir=node.install_dir,
              scratch=work / f"pod-{release}", fakebin=kernel.bin_dir, shared=[kernel.root],
              env={**kernel.env(), "NVIDIA_DRIVER_VERSION": V,
                   "NVIDIA_DRIVER_BASE_URL": f"{server.url}/tesla",
                   "REQUESTS_CA_BUNDLE": str(server.ca_bundle_path)})
    proc = ok(pod.run("bundle", "build", "--output-dir", out, "--kernel-release", release,
                      "--kernel-module-type", "proprietary", *args))
    return node, kernel, json.loads(proc.stdout), compiled(proc)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, driver_runs):
    """A build node runs `bundle build` for its own kernel and for another one, then
    `bundle index`: the directory a fleet's bundle server would hold."""
    from tests.fixtures.server import ArtifactServer

    work = tmp_path_factory.mktemp("bundle-build")
    with ArtifactServer() as server:
        for version, run in driver_runs.items():
            server.serve(f"/tesla/{version}/{run.name}", run)
        builds = {release: build_bundle(work, server, release) for release in (RELEASE, OTHER)}
    out = work / "bundles"
    out.mkdir()
    for node, *_ in builds.values():
        for f in (node.root / OUT.lstrip("/")).iterdir():
            shutil.copy(f, out / f.name)
    node = builds[RELEASE][0]
    pod = Pod(node_root=out.parent, install_dir=node.install_dir, scratch=work / "pod-index")
    ok(pod.run("bundle", "index", f"/root/{out.name}"))
    return {"dir": out, "builds": builds}


def publish(node, bundles, names=(NAME, OTHER_NAME), index=True) -> str:
    """Copy bundles (and the index) into the node's /srv/bundles; the file:// template."""
    dest = node.root / OUT.lstrip("/")
    dest.mkdir(parents=True, exist_ok=True)
    for name in (*names, *(("index.json",) if index else ())):
        shutil.copy(bundles["dir"] / name, dest / name)
    return f"file:///root{OUT}/"


def test_bundle_build_compiles_for_the_target_kernel_and_loads_nothing(bundles):
    node, kernel, doc, built = bundles["builds"][OTHER]
    assert doc["bundle"] == f"/root{OUT}/{OTHER_NAME}"
    assert doc["kernel_release"] == OTHER and doc["vermagic"].startswith(OTHER + " ")
    assert doc["compiler"] != "unknown"
    out = node.root / OUT.lstrip("/")
    assert sorted(p.name for p in out.iterdir()) == [OTHER_NAME, f"{OTHER_NAME}.sha256"]
    assert (out / f"{OTHER_NAME}.sha256").read_text().split() == [doc["sha256"], OTHER_NAME]
    assert built  # nvidia-installer ran, in the sandbox
    assert not [c for c in kernel.calls() if c["tool"] in ("insmod", "modprobe")]
    assert kernel.loaded() == {} and not list(node.install_dir.iterdir())
    index = json.loads((bundles["dir"] / "index.json").read_text())["bundles"]
    assert set(index) == {NAME, OTHER_NAME}
    assert index[OTHER_NAME]["sha256"] == doc["sha256"]


def test_install_from_bundle_runs_no_compiler_and_caches_as_compiled(node, pod, kernel, server,
                                                                       bundles):
    url = publish(node, bundles)
    proc = ok(pod.run("install", env={"NVIDIA_PREBUILT_URL": url}))
    final = last_event(proc)
    assert final["event"] == "install_finished" and final["plan"] == "fresh"
    assert "prebuilt_bundle_staged" in [e.get("event") for e in events(proc.stderr)]
    assert not compiled(proc) and not (node.install_dir / "nvidia-installer.log").exists()
    assert not server.requests_for(f"/tesla/{V}/NVIDIA-Linux-x86_64-{V}.run")
    assert {"nvidia", "nvidia_uvm"} <= set(kernel.loaded())  # what a node gets
    cache = (node.install_dir / ".cache").read_text()
    assert f"CACHE_KERNEL_VERSION={RELEASE}" in cache and "CACHE_FLAVOR=compiled-proprietary" in cache
    assert (node.install_dir / "lib64/libnvidia-ml.so.1").is_symlink()
    assert not (node.install_dir / ".staging").exists()
    # The next boot is an ordinary cache hit: same key as a compiled install.
    kernel.unload_all()
    assert last_event(ok(pod.run("install", env={"NVIDIA_PREBUILT_URL": url})))["plan"] == "cached"


def test_install_from_https_takes_the_digest_from_the_index(node, pod, kernel, server, bundles):
    server.serve_tree("/bundles", bundles["dir"])
    proc = ok(pod.run("install", env={"NVIDIA_PREBUILT_URL": f"{server.url}/bundles/"}))
    assert server.requests_for("/bundles/index.json") and server.requests_for(f"/bundles/{NAME}")
    assert not compiled(proc)


def test_missing_bundle_falls_back_to_compiling(node, pod, kernel, server, bundles):
    server.serve_tree("/bundles", bundles["dir"])
    proc = ok(pod.run("install", env={"NVIDIA_PREBUILT_URL": f"{server.url}/bundles/{{module_type}}-"
                                      "{kernel_release}-missing.tar.gz"}))
    assert "prebuilt_bundle_missing" in [e.get("event") for e in events(proc.stderr)]
    assert compiled(proc)
    assert "CACHE_FLAVOR=compiled-proprietary" in (node.install_dir / ".cache").read_text()


def test_missing_bundle_with_prebuilt_only_is_exit_5_naming_it(node, pod, kernel, bundles):
    url = publish(node, bundles, names=(OTHER_NAME,))
    proc = pod.run("install", "--prebuilt-only", env={"NVIDIA_PREBUILT_URL": url})
    assert proc.returncode == 5, proc.stderr[-2000:]
    final = last_event(proc)
    assert final["error_class"] == "download" and NAME in final["error"]
    assert not compiled(proc) and not (node.install_dir / ".cache").exists()


def test_tampered_bundle_is_exit_6_without_fallback(node, pod, kernel, bundles):
    url = publish(node, bundles)
    ok(pod.run("install", env={"NVIDIA_PREBUILT_URL": url}))
    before = (node.install_dir / ".cache").read_text()
    with open(node.root / OUT.lstrip("/") / NAME, "ab") as f:
        f.write(b"\0")
    proc = pod.run("install", "--force", env={"NVIDIA_PREBUILT_URL": url})
    assert proc.returncode == 6, proc.stderr[-2000:]
    final = last_event(proc)
    # Extracted while downloading: the zstd stream's end is refused as corrupt before the
    # body's digest is compared (a change inside a file is its digest; either is exit 6).
    assert final["error_class"] == "integrity", final
    assert "sha256 mismatch" in final["error"] or "corrupt archive" in final["error"], final
    assert not compiled(proc)
    assert (node.install_dir / ".cache").read_text() == before  # last good install kept
    assert not list((node.install_dir / ".staging").glob("**/bundle"))


def test_bundle_for_another_kernel_is_exit_6(node, pod, kernel, bundles):
    url = publish(node, bundles)
    # Told to install for OTHER, on a node running RELEASE: the modules' vermagic decides.
    proc = pod.run("install", env={"NVIDIA_PREBUILT_URL": url, "KERNEL_RELEASE": OTHER})
    assert proc.returncode == 6, proc.stderr[-2000:]
    error = last_event(proc)["error"]
    assert f"built for kernel {OTHER}, the running kernel is {RELEASE}" in error
    assert not compiled(proc) and kernel.loaded() == {}


def test_pinned_sha256_without_index(node, pod, kernel, bundles):
    url = publish(node, bundles, names=(NAME,), index=False)
    proc = pod.run("install", env={"NVIDIA_PREBUILT_URL": url})
    assert proc.returncode == 6 and "is not pinned" in last_event(proc)["error"]
    sha = (bundles["dir"] / f"{NAME}.sha256").read_text().split()[0]
    proc = ok(pod.run("install", env={"NVIDIA_PREBUILT_URL": url, "NVIDIA_PREBUILT_SHA256": sha}))
    assert not compiled(proc)


def test_a_gzip_bundle_published_before_zstd_installs(node, pod, kernel, bundles):
    """A directory holding only the .tar.gz of the bundle (as `bundle build` wrote them
    before zstd), indexed under that name: found through the index, read by its magic."""
    from tests.unit.test_bundle import repack

    dest = node.root / OUT.lstrip("/")
    dest.mkdir(parents=True)
    gz = repack(bundles["dir"] / NAME, dest / NAME.replace(".tar.zst", ".tar.gz"),
                lambda info, data: [(info, data)])
    ok(pod.run("bundle", "index", f"/root{OUT}"))
    assert list(json.loads((dest / "index.json").read_text())["bundles"]) == [gz.name]
    proc = ok(pod.run("install", env={"NVIDIA_PREBUILT_URL": f"file:///root{OUT}/"}))
    assert not compiled(proc) and "nvidia" in kernel.loaded()
    staged = [e for e in events(proc.stderr) if e.get("event") == "prebuilt_bundle_staged"]
    assert staged and staged[0]["url"].endswith(gz.name)


def test_dry_run_shows_the_bundle_before_the_build_steps(node, pod, kernel, bundles):
    url = publish(node, bundles)
    proc = ok(pod.run("install", "--dry-run", "-o", "json", env={"NVIDIA_PREBUILT_URL": url}))
    steps = json.loads(proc.stdout)["steps"]
    names = [s["name"] for s in steps]
    assert names.index("fetch_prebuilt_bundle") < names.index("build_driver")
    assert steps[names.index("fetch_prebuilt_bundle")]["detail"].startswith(
        f"file:///root{OUT}/{NAME}")
    assert "only without a prebuilt bundle" in steps[names.index("build_driver")]["detail"]
    assert not (node.install_dir / ".staging").exists() and kernel.loaded() == {}


def test_unsigned_bundle_on_a_signature_enforcing_kernel_is_exit_10(node, pod, kernel, bundles):
    url = publish(node, bundles)
    kernel.set_sig_enforce(True)
    proc = pod.run("install", env={"NVIDIA_PREBUILT_URL": url})
    assert proc.returncode == 10, proc.stderr[-2000:]
    assert NAME in last_event(proc)["error"] and "unsigned" in last_event(proc)["error"]
    # The one exit-10 refusal (signing.refusal), as the headers build and COS word it.
    assert last_event(proc)["error"].startswith("this node only loads signed kernel modules (")
    assert not compiled(proc) and kernel.loaded() == {}


def test_indexed_bundle_whose_manifest_lies_is_exit_6(node, pod, kernel, bundles):
    """The index pins the archive, so also its manifest; the tree must then match that
    manifest: a bundle whose nvidia-smi is not the one its manifest lists (re-packed, then
    honestly re-indexed) is refused after extraction, before anything is loaded."""
    from tests.unit.test_bundle import repack

    url = publish(node, bundles)
    dest = node.root / OUT.lstrip("/")

    def swap_smi(info, data):
        return [(info, b"\x7fELF not the manifest's" if info.name == "bin/nvidia-smi" else data)]

    repack(bundles["dir"] / NAME, dest / NAME, swap_smi)
    ok(pod.run("bundle", "index", f"/root{OUT}"))
    proc = pod.run("install", env={"NVIDIA_PREBUILT_URL": url})
    assert proc.returncode == 6, proc.stderr[-2000:]
    final = last_event(proc)
    assert final["error_class"] == "integrity", final
    assert "does not match its manifest: bin/nvidia-smi has sha256" in final["error"]
    assert not compiled(proc) and kernel.loaded() == {}
    assert not (node.install_dir / ".cache").exists() and not (node.install_dir / "bin").exists()


def test_signed_bundle_loads_on_a_signature_enforcing_kernel(tmp_path, driver_runs, node, pod,
                                                             kernel):
    """`bundle build --signing-key/--signing-cert` signs with the headers' scripts/sign-file
    (a stand-in here that appends a real module signature trailer); a node that only loads
    signed modules installs that bundle without compiling and loads every module."""
    from installer.kmod.modsign import MAGIC
    from tests.fixtures.server import ArtifactServer

    (tmp_path / "mok.key").write_text("KEY")
    (tmp_path / "mok.crt").write_text("CERT")

    with ArtifactServer() as server:
        for version, run in driver_runs.items():
            server.serve(f"/tesla/{version}/{run.name}", run)
        build_node, _, doc, _ = build_bundle(
            tmp_path / "build", server, RELEASE, "--signing-key", str(tmp_path / "mok.key"),
            "--signing-cert", str(tmp_path / "mok.crt"), setup=install_sign_file)
    assert doc["signed"] is True, doc
    dest = node.root / OUT.lstrip("/")
    shutil.copytree(build_node.root / OUT.lstrip("/"), dest)
    ok(pod.run("bundle", "index", f"/root{OUT}"))
    kernel.set_sig_enforce(True)
    proc = ok(pod.run("install", env={"NVIDIA_PREBUILT_URL": f"file:///root{OUT}/"}))
    staged = [e for e in events(proc.stderr) if e.get("event") == "prebuilt_bundle_staged"]
    assert staged and staged[-1]["signed"] is True and not compiled(proc)
    assert {"nvidia", "nvidia_uvm"} <= set(kernel.loaded())  # what a node gets
    for ko in (node.install_dir / "drivers").glob("*.ko"):
        assert ko.read_bytes().endswith(MAGIC), ko


def install_sign_file(build_node) -> None:
    """The kernel's scripts/sign-file in the build node's headers: the tests' stand-in."""
    from tests.unit.test_bundle import SIGN_FILE

    tool = build_node.headers_dir / "scripts/sign-file"
    tool.parent.mkdir(parents=True, exist_ok=True)
    tool.write_text(SIGN_FILE)
    tool.chmod(0o755)
