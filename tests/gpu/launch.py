"""The GPU tier's children, each with the guard installed first (tests/gpu/guard.py):

  python -m tests.gpu.launch cli ARGS...   the installer's CLI (``nvidia-driver-installer ARGS``)
  python -m tests.gpu.launch ns SPEC.json  a job in the private mount namespace that
                                           ``unshare --mount --propagation private`` made

A namespace job first checks its mount namespace is not the one it was started from (else
it refuses to mount anything), mounts an empty tmpfs on /dev with null, zero and urandom,
and bind-mounts a refusing stub over modprobe/insmod/rmmod/kmod: in there, nothing can load
or unload a module (nvidia-modprobe execs modprobe; the stub logs what it was asked).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from installer import cuda_probe
from tests.gpu import guard
from tests.gpu.node import NOBODY, dev_listing

HERE = Path(__file__).resolve().parent
STUB_LOG = Path("/dev/.ndi-module-calls")
STUB = Path("/dev/.ndi-module-stub")
MODULE_TOOL_PATHS = ("/sbin/modprobe", "/usr/sbin/modprobe", "/sbin/insmod", "/usr/sbin/insmod",
                     "/sbin/rmmod", "/usr/sbin/rmmod", "/bin/kmod", "/usr/bin/kmod")


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


def fresh_dev() -> None:
    """An empty tmpfs on /dev: null, zero, urandom only (as the probe made it)."""
    _mount("-t", "tmpfs", "-o", "mode=755", "ndi-gpu-dev", "/dev")
    for name, minor in (("null", 3), ("zero", 5), ("urandom", 9)):
        os.mknod(f"/dev/{name}", 0o20666, os.makedev(1, minor))
        os.chmod(f"/dev/{name}", 0o666)
    STUB.write_text(f'#!/bin/sh\necho "$0 $*" >> {STUB_LOG}\n'
                    'echo "ndi gpu tier: $0 $* refused (read-only)" >&2\nexit 1\n')
    STUB.chmod(0o755)
    STUB_LOG.touch()
    STUB_LOG.chmod(0o666)  # a call made as uid 65534 is recorded too
    targets = set()
    modprobe = Path("/proc/sys/kernel/modprobe")
    for p in ((modprobe.read_text().strip() if modprobe.is_file() else ""), *MODULE_TOOL_PATHS):
        if p and os.path.exists(p):
            targets.add(os.path.realpath(p))
    for t in sorted(targets):
        _mount("--bind", str(STUB), t)


def module_calls() -> list[str]:
    return STUB_LOG.read_text().splitlines() if STUB_LOG.is_file() else []


def as_nobody(argv: list[str], env: dict[str, str], timeout: float = 180) -> dict[str, object]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd="/", user=NOBODY, group=NOBODY, extra_groups=[])
    return {"rc": proc.returncode, "stdout": proc.stdout[-4000:], "stderr": proc.stderr[-4000:]}


def job_devnodes(spec: dict) -> dict[str, object]:
    from installer import devnodes
    from installer.errors import InstallerError
    from installer.kernel import KernelRoots, KernelState, use_roots
    from installer.runner import Runner

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
    # The installer's own CUDA check child (installer/cuda_probe.py), 64 MiB per GPU as the
    # probe of shared/reference/gpu-node/cudacheck.py; read as text: uid 65534 may not read
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


JOBS = {"devnodes": job_devnodes, "smi_nobody": job_smi_nobody, "smi_nolib": job_smi_nolib}


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
    from installer.cli import main as cli_main

    cli_main(sys.argv[2:])


if __name__ == "__main__":
    main()
