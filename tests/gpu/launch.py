"""The GPU tier's children, each with the guard installed first (tests/gpu/guard.py):

  python -m tests.gpu.launch cli ARGS...   the installer's CLI (``nvidia-driver-installer ARGS``)
  python -m tests.gpu.launch ns SPEC.json  a job in the private mount namespace

Both run only in a private mount namespace of their own (``unshare --mount --propagation
private``, tests/gpu/node.py ``cli`` and ``in_namespace``): each first checks its mount
namespace is not the one it was started from (else it refuses, exit 3, and runs nothing),
then mounts a tmpfs on /dev with null, zero, urandom and kmsg, copies of the node's NVIDIA
device files (read before the tmpfs hides them; none for the jobs that test making them),
and bind-mounts a refusing stub over modprobe/insmod/rmmod/kmod and every nvidia-modprobe
(the install dir's, PATH's, GKE's): in there nothing can load or unload a module or make a
file in the node's /dev (libcuda and NVML fork nvidia-modprobe outside any Python hook; the
stub logs what it was asked). The layout is that of the namespace probes run on a real H100 node
(docs/nvidia-facts.md, "CUDA and the fabric on a real H100 node").
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from installer.services import cuda_probe
from tests.gpu import guard
from tests.gpu.node import NOBODY, dev_listing

HERE = Path(__file__).resolve().parent
STUB_LOG = Path("/dev/.ndi-module-calls")
STUB = Path("/dev/.ndi-module-stub")
MODULE_TOOL_PATHS = ("/sbin/modprobe", "/usr/sbin/modprobe", "/sbin/insmod", "/usr/sbin/insmod",
                     "/sbin/rmmod", "/usr/sbin/rmmod", "/bin/kmod", "/usr/bin/kmod")


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


NVIDIA_MODPROBE_PATHS = ("/usr/bin/nvidia-modprobe", "/usr/local/nvidia/bin/nvidia-modprobe",
                         "/home/kubernetes/bin/nvidia/bin/nvidia-modprobe")
NS_ENV = "NDI_GPU_NS"  # cli mode: JSON {"parent_mnt_ns", "install_dir", "attest"}


def node_device_files(dev: Path = Path("/dev")) -> list[tuple[str, int, int, int, int]]:
    """The node's NVIDIA character device files: (name, mode, uid, gid, rdev)."""
    out = []
    for p in sorted([*dev.glob("nvidia*"), *dev.glob("nvidia-caps/*"),
                     *dev.glob("nvidia-caps-imex-channels/*")]):
        st = p.lstat()
        if stat.S_ISCHR(st.st_mode):
            out.append((str(p.relative_to(dev)), stat.S_IMODE(st.st_mode), st.st_uid,
                        st.st_gid, st.st_rdev))
    return out


def node_char_links(dev: Path = Path("/dev")) -> list[tuple[str, str]]:
    """The node's /dev/char links to NVIDIA device files: (name, target)."""
    out = []
    for p in sorted((dev / "char").glob("*")):
        if p.is_symlink() and "nvidia" in (target := os.readlink(p)):
            out.append((p.name, target))
    return out


def nvidia_modprobes(install_dir: str | None) -> list[str]:
    """Every nvidia-modprobe a command here could run (libcuda and NVML run the one on
    PATH; the installer, the install dir's)."""
    found = [*NVIDIA_MODPROBE_PATHS, shutil.which("nvidia-modprobe") or ""]
    if install_dir:
        found.append(os.path.join(install_dir, "bin/nvidia-modprobe"))
    return [p for p in found if p and os.path.exists(p)]


def fresh_dev(copies: list[tuple[str, int, int, int, int]] = (),
              also_stub: list[str] = ()) -> list[str]:
    """A tmpfs on /dev: null, zero, urandom, kmsg and ``copies``; module tools and
    ``also_stub`` replaced by the refusing stub. Returns the files stubbed."""
    _mount("-t", "tmpfs", "-o", "mode=755", "ndi-gpu-dev", "/dev")
    for name, minor, mode in (("null", 3, 0o666), ("zero", 5, 0o666), ("urandom", 9, 0o666),
                              ("kmsg", 11, 0o644)):  # kmsg: doctor reads the node's kernel log
        os.mknod(f"/dev/{name}", stat.S_IFCHR | mode, os.makedev(1, minor))
        os.chmod(f"/dev/{name}", mode)
    for name, mode, uid, gid, rdev in copies:
        path = Path("/dev", name)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(path, stat.S_IFCHR | mode, rdev)
        os.chmod(path, mode)
        os.chown(path, uid, gid)
    STUB.write_text(f'#!/bin/sh\necho "$0 $*" >> {STUB_LOG}\n'
                    'echo "ndi gpu tier: $0 $* refused (read-only)" >&2\nexit 1\n')
    STUB.chmod(0o755)
    STUB_LOG.touch()
    STUB_LOG.chmod(0o666)  # a call made as uid 65534 is recorded too
    targets = set()
    modprobe = Path("/proc/sys/kernel/modprobe")
    for p in ((modprobe.read_text().strip() if modprobe.is_file() else ""), *MODULE_TOOL_PATHS,
              *also_stub):
        if p and os.path.exists(p):
            targets.add(os.path.realpath(p))
    for t in sorted(targets):
        _mount("--bind", str(STUB), t)
    return sorted(targets)


def enter_private_node(parent_mnt_ns: int, install_dir: str | None,
                       copy_devices: bool = True) -> dict[str, object]:
    """Make this process's view of the node read-only (see the module doc), or refuse.
    Returns what it did, for the report and the tier's own tests."""
    if os.stat("/proc/self/ns/mnt").st_ino == parent_mnt_ns:
        raise NotPrivate("not in a mount namespace of our own: nothing run")
    copies = node_device_files() if copy_devices else []
    links = node_char_links() if copy_devices else []
    guard.ALLOW_MOUNT = True  # mounts from here on stay here (unshare --propagation private)
    try:
        stubbed = fresh_dev(copies, nvidia_modprobes(install_dir))
    finally:
        guard.ALLOW_MOUNT = False  # what runs next mounts nothing
    for sub in ("char", "shm"):  # as devtmpfs has them (probe3.sh makes both too)
        os.makedirs(f"/dev/{sub}", exist_ok=True)
    for name, target in links:  # the node's /dev/char links to NVIDIA files, as they are
        os.symlink(target, f"/dev/char/{name}")
    return {"mnt_ns": os.stat("/proc/self/ns/mnt").st_ino, "dev_fs": mount_type("/dev"),
            "stubbed": stubbed, "dev": dev_listing(Path("/dev"))}


class NotPrivate(Exception):
    pass


def mount_type(target: str) -> str | None:
    """The file system type mounted at ``target`` in this namespace (the last mount wins)."""
    kind = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        sep = fields.index("-")
        if fields[4] == target:
            kind = fields[sep + 1]
    return kind


def module_calls() -> list[str]:
    return STUB_LOG.read_text().splitlines() if STUB_LOG.is_file() else []


def as_nobody(argv: list[str], env: dict[str, str], timeout: float = 180) -> dict[str, object]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd="/", user=NOBODY, group=NOBODY, extra_groups=[])
    return {"rc": proc.returncode, "stdout": proc.stdout[-4000:], "stderr": proc.stderr[-4000:]}


def job_devnodes(spec: dict) -> dict[str, object]:
    from installer.base.errors import InstallerError
    from installer.host.runner import Runner
    from installer.kmod import devnodes
    from installer.kmod.kernel import KernelRoots, KernelState, use_roots

    fresh_dev()
    use_roots(KernelRoots(dev=Path("/dev")))  # the tmpfs: the installer's /dev here
    kernel = KernelState()
    out: dict[str, object] = {"plan": devnodes.plan(kernel, ()).describe()}
    try:
        out["created"] = devnodes.create(Path(spec["modprobe"]), kernel, Runner(), ())
    except InstallerError as exc:
        out["error"] = {"message": exc.message, "hint": exc.hint}
    out["dev"] = dev_listing(Path("/dev"))
    out["module_calls"] = module_calls()
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}
    if spec.get("lib64"):
        env["LD_LIBRARY_PATH"] = spec["lib64"]
    python = os.path.realpath(sys.executable)
    # The installer's own CUDA check child (installer/services/cuda_probe.py), 64 MiB per GPU as the
    # probe run on a real H100 (docs/nvidia-facts.md); read as text: uid 65534 may not read
    # the checkout.
    src = Path(cuda_probe.__file__).read_text()
    out["cuda"] = as_nobody([python, "-I", "-c", src, "libcuda.so.1", str(64 << 20)], env)
    out["dev_after_cuda"] = dev_listing(Path("/dev"))
    return out


def job_smi_nobody(spec: dict) -> dict[str, object]:
    fresh_dev()
    out = as_nobody([spec["smi"], "--query-gpu=name,driver_version,pci.bus_id",
                     "--format=csv,noheader"], spec["env"])
    out["dev"] = dev_listing(Path("/dev"))
    return out


def job_smi_nolib(spec: dict) -> dict[str, object]:
    hidden = sorted({os.path.realpath(p) for p in spec["libs"] if os.path.exists(p)})
    for lib in hidden:
        _mount("--bind", "/dev/null", lib)
    proc = subprocess.run([spec["smi"], "--query-gpu=name,driver_version,pci.bus_id",
                           "--format=csv,noheader"], capture_output=True, text=True,
                          timeout=120, env=spec["env"])
    return {"hidden": hidden, "rc": proc.returncode, "stdout": proc.stdout[-4000:],
            "stderr": proc.stderr[-4000:]}


def job_run(spec: dict) -> dict[str, object]:
    """Commands (nvidia-smi's queries: the snapshot's too) on the read-only node view."""
    node = enter_private_node(spec["parent_mnt_ns"], spec.get("install_dir"))
    runs = []
    for argv in spec["argvs"]:
        proc = subprocess.run(argv, capture_output=True, text=True, env=spec["env"],
                              timeout=spec.get("timeout", 120))
        runs.append({"rc": proc.returncode, "stdout": proc.stdout[-20000:],
                     "stderr": proc.stderr[-4000:]})
    return {"node": node, "runs": runs, "module_calls": module_calls()}


JOBS = {"devnodes": job_devnodes, "smi_nobody": job_smi_nobody, "smi_nolib": job_smi_nolib,
        "run": job_run}


def namespace(spec_file: str) -> int:
    spec = json.loads(Path(spec_file).read_text())
    out = Path(spec["out"])
    if os.stat("/proc/self/ns/mnt").st_ino == spec["parent_mnt_ns"]:
        out.write_text(json.dumps({"refused": "not in a mount namespace of our own"}))
        return 3
    # Mounts made from here on stay in this namespace (unshare --propagation private).
    guard.ALLOW_MOUNT = True
    try:
        result = JOBS[spec["job"]](spec)
    except Exception as exc:  # noqa: BLE001 - the test reports it
        result = {"crashed": f"{type(exc).__name__}: {exc}"}
    out.write_text(json.dumps(result))
    return 0


def main() -> None:
    guard.install()
    if len(sys.argv) < 2 or sys.argv[1] not in ("cli", "ns"):
        sys.exit("usage: python -m tests.gpu.launch cli ARGS... | ns SPEC.json")
    if sys.argv[1] == "ns":
        sys.exit(namespace(sys.argv[2]))
    sys.exit(cli(sys.argv[2:]))


def cli(argv: list[str]) -> int:
    """The installer's CLI on the read-only node view; what that view was (and what the
    stub refused) goes to the file NS_ENV's "attest" names."""
    ns = json.loads(os.environ.get(NS_ENV) or "null")
    if not isinstance(ns, dict) or "parent_mnt_ns" not in ns:
        print(f"tests.gpu.launch cli: refused: no {NS_ENV} (run it through tests/gpu/node.py "
              "cli)", file=sys.stderr)
        return 3
    try:
        node = enter_private_node(int(ns["parent_mnt_ns"]), ns.get("install_dir"))
    except NotPrivate as exc:
        print(f"tests.gpu.launch cli: refused: {exc}", file=sys.stderr)
        return 3
    from installer.cli import main as cli_main

    try:
        cli_main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    finally:
        if ns.get("attest"):
            node["module_calls"] = module_calls()
            Path(ns["attest"]).write_text(json.dumps(node))
    return 0


if __name__ == "__main__":
    main()
