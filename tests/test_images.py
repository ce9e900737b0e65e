"""The built images, run the way the DaemonSet's init container runs them (slow tier).

Skipped unless NDI_IMAGE_TESTS=1 (``make test-images``); needs root. Builds the
images with images/build.sh (cached base and layers make a re-run quick), then
for each test a fresh container: ``buildah from`` + ``buildah mount`` gives its
rootfs (the image plus the container's own writable layer, an overlay as a
pod's is, so the installer's own overlay nests exactly as deep as on a node),
and inside ``unshare --mount --pid --fork`` that rootfs gets the fixture node
bound at /root, its install dir at /usr/local/nvidia, and /dev, /proc, /sys as
in a privileged pod. The container is removed after the test. The image's own
ENTRYPOINT, CMD and ENV run it, with the env of the committed DaemonSet: a real
install happens inside the image.

What is faked is what CI cannot have (tests/fixtures/README.md): the kernel
(kmod stand-ins over a fake procfs/sysfs, copied into the container's
/usr/local/sbin, first on the image's PATH), NVIDIA's download host (a local
HTTPS server with a private CA) and, for Ubuntu, apt (no jammy archive here:
the fixture node carries the headers).

Both images are built FROM a debootstrap bookworm base here (images/build.sh),
so the Ubuntu image's userland is Debian's: this checks the Dockerfile, the
packaged installer and its runtime tools, not Ubuntu's packages.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from installer import __version__
from installer.commands.manifests import values
from tests.pod import events as pod_events

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("NDI_IMAGE_CACHE", "/var/cache/ndi-images"))
STORAGE_ROOT = os.environ.get("NDI_BUILDAH_ROOT", str(CACHE / "storage"))
RUNROOT = os.environ.get("NDI_BUILDAH_RUNROOT", "/run/ndi-images")
# The build's bound (s): NDI_IMAGE_BUILD_TIMEOUT, which .ci/run sets inside the tier's
# budget so that a cold machine (no base, no layer) still builds both architectures. The
# first test's timeout covers the module's build fixture, so it is the bound plus a test.
BUILD_BOUND_S = int(os.environ.get("NDI_IMAGE_BUILD_TIMEOUT") or 1080)

pytestmark = [
    pytest.mark.chroot,
    pytest.mark.skipif(os.environ.get("NDI_IMAGE_TESTS") != "1",
                       reason="image tier: set NDI_IMAGE_TESTS=1 (make test-images)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="buildah, mounts and chroot need root"),
    pytest.mark.timeout(max(900, BUILD_BOUND_S + 300)),
]

FAKE_APT_GET = """#!/bin/sh
# Stand-in for apt-get: no Ubuntu archive here. The fixture node has headers.
echo "apt-get $*" >> "${FAKE_CALL_LOG:-/dev/null}"
case "$1" in
  install) echo "E: Unable to locate package (image test: no archive)" >&2; exit 100 ;;
esac
exit 0
"""


def buildah(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(["buildah", "--root", STORAGE_ROOT, "--runroot", RUNROOT, *args],
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode:
        raise AssertionError(f"buildah {' '.join(args)}: rc {proc.returncode}\n{proc.stderr}")
    return proc


def image_name(flavor: str) -> str:
    return f"localhost/nvidia-driver-installer-{flavor}:{values.image_tag()}"


@pytest.fixture(scope="module")
def built() -> dict[str, str]:
    """Build (or reuse) both images with images/build.sh."""
    if os.environ.get("NDI_IMAGE_TESTS_NO_BUILD") != "1":
        # The local substitute base: the real ones' registry is unreachable in CI. Both
        # architectures: arm64's base and runtime-stage RUN steps under qemu-user (minutes
        # each, cached by content); every image's venv stage runs natively.
        bound = BUILD_BOUND_S
        try:
            proc = subprocess.run(["bash", str(REPO / "images/build.sh")], capture_output=True,
                                  text=True, timeout=bound,
                                  env={**os.environ, "NDI_LOCAL_BASE": "1"})
        except subprocess.TimeoutExpired:
            pytest.fail(f"images/build.sh ran past {bound} s: on an empty cache the arm64 base and "
                        "layers under qemu-user take longer on 2 cores (docs/arm64.md#images); "
                        "what was built stays cached: run NDI_LOCAL_BASE=1 make images once")
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert "BOTH flavours are built FROM the bookworm base" in proc.stderr
    return {f: image_name(f) for f in values.IMAGE_FLAVORS}


@dataclass
class Image:
    name: str
    rootfs: Path
    config: dict  # OCI image config: Entrypoint, Cmd, Env, Labels

    def exists(self, path: str) -> bool:
        return os.path.lexists(self.rootfs / path.lstrip("/"))


@pytest.fixture(scope="module", params=values.IMAGE_FLAVORS)
def image(request, built) -> Image:
    flavor = request.param
    name = built[flavor]
    ctr = buildah("from", "--pull-never", name).stdout.strip()
    try:
        rootfs = Path(buildah("mount", ctr).stdout.strip())
        config = json.loads(buildah("inspect", "--type", "image", name).stdout)["OCIv1"]["config"]
        yield Image(name, rootfs, config)
    finally:
        buildah("umount", ctr, check=False)
        buildah("rm", ctr, check=False)


def flavor_of(image: Image) -> str:
    return image.config["Labels"]["org.opencontainers.image.title"].rsplit("-", 1)[1]


@pytest.fixture
def container(image) -> Path:
    """A fresh working container of the image: its mounted rootfs."""
    ctr = buildah("from", "--pull-never", image.name).stdout.strip()
    try:
        yield Path(buildah("mount", ctr).stdout.strip())
    finally:
        buildah("umount", ctr, check=False)
        buildah("rm", ctr, check=False)


@dataclass
class ImagePod:
    """One container of the image, run like the DaemonSet's init container."""

    image: Image
    rootfs: Path  # the container's mounted rootfs (writable layer over the image)
    mounts: list[tuple[Path, str]]  # (source on this machine, mountPath), in manifest order
    fakebin: Path | None = None
    shared: list[Path] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """No args: the image's CMD; else args replace it (as `args:` does)."""
        cfg = self.image.config
        argv = [*cfg.get("Entrypoint", []), *(args or cfg.get("Cmd", []))]
        image_env = dict(e.split("=", 1) for e in cfg.get("Env", []))
        full_env = {**image_env, **self.env, **(env or {})}
        script = self._script(argv, full_env)
        return subprocess.run(["unshare", "--mount", "--pid", "--fork", "--", "sh", "-ec", script],
                              capture_output=True, text=True, timeout=timeout,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})

    def _script(self, argv: list[str], env: dict[str, str]) -> str:
        q = shlex.quote
        r = q(str(self.rootfs))
        lines = [
            "mount --make-rprivate /",
            f"mount --bind {r} {r}",  # a mount point: pivot_root below needs one
            f"mkdir -p {r}/usr/local/sbin {r}/proc {r}/sys",
        ]
        # The DaemonSet's hostPath mounts (the pod contract, docs/contract.md §2), then
        # what a privileged pod gets: its own /proc, the host's /sys.
        for source, target in self.mounts:
            dest = r + q(target)
            lines += [f"mkdir -p {dest}", f"mount --rbind {q(str(source))} {dest}"]
        lines += [f"mount -t proc proc {r}/proc", f"mount --rbind /sys {r}/sys"]
        for path in self.shared:
            lines += [f"mkdir -p {r}{q(str(path))}", f"mount --bind {q(str(path))} {r}{q(str(path))}"]
        if self.fakebin:
            lines.append(f"cp -a {q(str(self.fakebin))}/. {r}/usr/local/sbin/")
            if not self.image.exists("/usr/bin/python3"):
                # The kmod stand-in is a /usr/bin/python3 script; this image only has
                # python3.11 (the Ubuntu one): point the stand-in's copy at that.
                lines.append(f"sed -i '1s|.*|#!/usr/bin/python3.11|' {r}/usr/local/sbin/fakekmod")
        lines.append(f"cat > {r}/usr/local/sbin/apt-get <<'APT'\n{FAKE_APT_GET}APT")
        lines.append(f"chmod 755 {r}/usr/local/sbin/apt-get")
        env_words = " ".join(q(f"{k}={v}") for k, v in env.items())
        # pivot_root as a runtime does, not chroot: bwrap (the build jail) resolves its
        # bind sources from the namespace's root.
        lines.append(f"cd {r} && pivot_root . . && umount -l . && cd /")
        lines.append(f"exec env -i {env_words} sh -c "
                     + q("cd / && exec " + " ".join(q(a) for a in argv)))
        return "\n".join(lines)


def committed_daemonset(flavor: str) -> tuple[dict, dict]:
    """(pod spec, init container) of the committed DaemonSet."""
    yaml = pytest.importorskip("yaml")
    ds = yaml.safe_load((REPO / "manifests" / values.daemonset_filename(flavor)).read_text())
    spec = ds["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    assert init["command"] == ["nvidia-driver-installer"] and init["args"] == ["install"]
    return spec, init


def manifest_env(flavor: str) -> dict[str, str]:
    """The init container's env from the committed DaemonSet."""
    _, init = committed_daemonset(flavor)
    return {e["name"]: e["value"] for e in init["env"]}


def manifest_mounts(flavor: str, node_root: Path) -> list[tuple[Path, str]]:
    """The init container's hostPath mounts from the committed DaemonSet, with the
    fixture node standing in for the host (its /dev is this machine's)."""
    spec, init = committed_daemonset(flavor)
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"]}
    out = []
    for vm in init["volumeMounts"]:
        host = volumes[vm["name"]]
        source = Path("/dev") if host["path"] == "/dev" else node_root / host["path"].lstrip("/")
        if host.get("type") == "DirectoryOrCreate":
            source.mkdir(parents=True, exist_ok=True)
        assert source.is_dir(), f"hostPath {host['path']} ({host.get('type')}) missing on the node"
        out.append((source, vm["mountPath"]))
    return out


def events(stderr: str) -> list[dict]:
    return [e for e in pod_events(stderr) if "event" in e]


# --- the image itself ----------------------------------------------------------------------


def test_image_config(image):
    cfg = image.config
    flavor = flavor_of(image)
    assert cfg["Entrypoint"] == ["nvidia-driver-installer"]
    assert cfg["Cmd"] == ["install"]
    labels = cfg["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.title"] == f"nvidia-driver-installer-{flavor}"
    for key in ("revision", "created", "source", "licenses", "base.name"):
        assert labels[f"org.opencontainers.image.{key}"], key
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert env["PYTHONNOUSERSITE"] == "1"


def test_image_contents(image):
    flavor = flavor_of(image)
    for tool in ("usr/local/bin/nvidia-driver-installer", "usr/bin/make", "usr/bin/xz",
                 "usr/bin/kmod", "sbin/insmod", "usr/bin/mount", "usr/sbin/ldconfig",
                 "etc/ssl/certs/ca-certificates.crt"):
        assert image.exists(tool) or image.exists(tool.replace("usr/", "", 1)), tool
    # libc6-dev in both: GKE's v2 image carries it for the module build (docs/nvidia-facts.md,
    # "libc headers"); nvidia-installer's check_development_tools looks for exactly this.
    assert image.exists("usr/include/stdio.h")
    if flavor == "ubuntu":
        assert image.exists("usr/bin/gcc")
        # Debian nodes' headers: CC=gcc-12 (their CONFIG_CC_VERSION_TEXT), pahole (6.12's BTF)
        assert image.exists("usr/bin/gcc-12") and image.exists("usr/bin/pahole")
        assert image.exists("usr/bin/apt-get") and image.exists("etc/apt/sources.list")
    else:
        assert not image.exists("usr/bin/gcc") and not image.exists("usr/bin/cc")
    # Multi-stage: no build leftovers; small: no apt lists, no .debs, no pip cache.
    assert not image.exists("src") and not image.exists("wheels")
    assert not list((image.rootfs / "var/lib/apt/lists").glob("*_Packages*"))
    assert not list((image.rootfs / "var/cache/apt/archives").glob("*.deb"))
    assert not image.exists("root/.cache/pip")
    # The package is the repo's own wheel.
    site = list((image.rootfs / "opt/nvidia-driver-installer/lib").glob(
        "python3*/site-packages/nvidia_driver_installer-*.dist-info"))
    assert [p.name for p in site] == [f"nvidia_driver_installer-{__version__}.dist-info"]
    templates = list((image.rootfs / "opt/nvidia-driver-installer/lib").glob(
        "python3*/site-packages/installer/templates/daemonset.yaml.j2"))
    assert templates, "templates are not in the wheel (package-data)"


# --- run as the pod runs it ----------------------------------------------------------------


@pytest.fixture
def kernel(tmp_path, image):
    from tests.fixtures.kernel import FakeKernel
    from tests.fixtures.node import COS_KERNEL, UBUNTU_KERNEL

    k = FakeKernel(tmp_path / "kernel", COS_KERNEL if flavor_of(image) == "cos" else UBUNTU_KERNEL)
    k.add_gpu()
    return k


@pytest.fixture
def node(tmp_path, image, kernel):
    from tests.fixtures.node import build_cos_node, build_ubuntu_node

    build = build_cos_node if flavor_of(image) == "cos" else build_ubuntu_node
    return build(tmp_path / "node", kernel_release=kernel.release)


@pytest.fixture
def pod(image, container, node, kernel):
    from tests.fixtures.kernel import HOOK_DIR

    flavor = flavor_of(image)
    return ImagePod(image=image, rootfs=container, mounts=manifest_mounts(flavor, node.root),
                    fakebin=kernel.bin_dir, shared=[kernel.root, HOOK_DIR],
                    env={**manifest_env(flavor), **kernel.env()})


def test_entrypoint_help(pod):
    proc = pod.run("--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("install", "detect", "manifests"):
        assert command in proc.stdout


def test_entrypoint_renders_the_committed_manifests(pod):
    """The packaged templates are the repo's: the image renders what is committed."""
    proc = pod.run("manifests", "render", "--all")
    assert proc.returncode == 0, proc.stderr
    committed = "".join((REPO / "manifests" / values.daemonset_filename(f)).read_text()
                        for f in values.FLAVORS)
    assert proc.stdout == committed


def test_detect_reads_the_node_through_the_pod_mounts(pod, image, kernel):
    proc = pod.run("detect", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    host = json.loads(proc.stdout)
    text = json.dumps(host)
    assert flavor_of(image) in text
    assert kernel.release in text


def test_default_cmd_installs_on_the_fixture_node(pod, image, node, kernel, tmp_path):
    """The image's ENTRYPOINT + CMD with the DaemonSet's env: a real install."""
    from tests.fixtures.server import ArtifactServer

    flavor = flavor_of(image)
    with ArtifactServer() as server:
        env = {"REQUESTS_CA_BUNDLE": str(server.ca_bundle_path),
               "NVIDIA_DRIVER_BASE_URL": f"{server.url}/tesla"}
        if flavor == "ubuntu":
            from tests.fixtures.runfile import DEFAULT_VERSION, build_driver_run

            version = DEFAULT_VERSION
            run = build_driver_run(tmp_path / "runs", version)
            server.serve(f"/tesla/{version}/{run.name}", run)
            env["NVIDIA_DRIVER_VERSION"] = version
        else:
            from tests.cosbucket import DEFAULT_V, Bucket, env_recording_run

            version = DEFAULT_V  # the manifest's NVIDIA_DRIVER_VERSION=default resolves to it
            run = env_recording_run(tmp_path / "runs", version)
            server.serve(f"/tesla/{version}/{run.name}", run)
            bucket = Bucket(tmp_path / "bucket")
            bucket.write()
            env["COS_DOWNLOAD_GCS"] = bucket.serve(server)
        pod.shared.append(Path(server.ca_bundle_path).parent)
        proc = pod.run(env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    final = events(proc.stderr)[-1]
    assert final["event"] == "install_finished", final
    assert final["driver_version"] == version
    install = node.install_dir
    for rel in ("bin/nvidia-smi", "lib64/libnvidia-ml.so.1", "drivers/nvidia.ko", ".cache",
                "status.json"):
        assert (install / rel).exists(), rel
    assert json.loads((install / "status.json").read_text())["outcome"] == "ok"
    assert {"nvidia", "nvidia_uvm"} <= set(kernel.loaded())
    if flavor == "cos":
        from tests.cosbucket import CC

        # The toolchain landed in the host's cache through the /build/cos-tools mount.
        assert any((node.root / "var/lib/cos-tools").iterdir())
        # And it compiled, in this image: the bucket has no prebuilt modules, so NVIDIA's
        # Makefile built them with the COS toolchain's compiler.
        steps = [s["name"] for s in json.loads((install / "status.json").read_text())["steps"]]
        assert "build_driver" in steps
        assert "CACHE_FLAVOR=compiled-" in (install / ".cache").read_text()
        build_log = (install / "kernel-build.log").read_text()
        assert f"{CC} (fake COS toolchain)" in build_log
        assert [ln for ln in build_log.splitlines()
                if ln.strip().startswith("LD [M]") and ln.endswith("/nvidia.ko")]
    assert (node.root / "etc/ld.so.conf.d/nvidia.conf").read_text() == \
        f"{values.INSTALL_DIR_HOST}/lib64\n"
    # The image's interpreter did it: nothing of this machine's venv was reachable.
    assert not shutil.which("nvidia-smi")
