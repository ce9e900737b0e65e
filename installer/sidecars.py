"""What the daemon sidecars do before NVIDIA's daemon runs (daemons_cli.py is their CLI).

A sidecar starts with the pod, before the install has loaded the driver: it waits (bounded)
for the loaded driver and for the daemon's files of that very version in the install dir,
checks what the daemon needs, writes its config, then hands over to daemons.run_foreground
(the fabric manager) or forking.run_forking (nvidia-persistenced, which always forks).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from installer import fabricmanager, modules
from installer.errors import VerifyError
from installer.kernel import KernelState

log = structlog.get_logger(__name__)

POLL_S = 5.0


def wait_for_driver(kernel: KernelState, files_for: Callable[[str], Path | None], what: str,
                    deadline_s: float, *, clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> tuple[str, Path]:
    """The loaded driver's version and ``files_for(version)`` once both are there; the
    install may still be downloading or building: poll until ``deadline_s``."""
    end, logged = clock() + deadline_s, False
    while True:
        version = modules.loaded_driver_version(kernel)
        found = files_for(version) if version and version != "unknown" else None
        if version and found is not None:
            return version, found
        if clock() >= end:
            raise VerifyError(
                f"{what}: no {'driver loaded' if not version else f'files for driver {version}'}"
                f" after {deadline_s:g}s", hint="check the nvidia-driver-installer container's "
                "log: the install has not finished")
        if not logged:
            log.info("sidecar_waiting_for_driver", daemon=what, loaded_version=version)
            logged = True
        sleep(POLL_S)


def fabric_manager_files(install_root: Path) -> Callable[[str], Path | None]:
    def files_for(version: str) -> Path | None:
        if fabricmanager.installed(install_root, version):
            return fabricmanager.version_dir(install_root, version)
        return None

    return files_for


def persistenced_files(install_root: Path) -> Callable[[str], Path | None]:
    def files_for(version: str) -> Path | None:
        binary = install_root / "bin/nvidia-persistenced"
        return binary if binary.is_file() else None

    return files_for


# nvidia-persistenced's fixed runtime dir: pid file and RPC socket (nvpd_defs.h
# NVPD_VAR_RUNTIME_DATA_PATH, NVIDIA/nvidia-persistenced).
PERSISTENCED_RUN_DIR = Path("/var/run/nvidia-persistenced")


def persistenced_argv(binary: Path, install_root: Path) -> list[str]:
    """nvidia-persistenced's own options only (options.c, option-table.h): persistence mode
    on for every GPU, verbose syslog (state changes too), and libnvidia-cfg.so.1 from the
    install dir, which the node's ld cache does not know. No --user: the sidecar runs as
    root and the device files are the driver's."""
    return [str(binary), "--persistence-mode", "--verbose",
            f"--nvidia-cfg-path={install_root / 'lib64'}"]


def fabric_config(template: str, fm_dir: Path) -> str:
    """NVIDIA's fabricmanager.cfg made fit for a container: in the foreground
    (``DAEMONIZE=0``), logging to stderr (``LOG_FILE_NAME=``), topology files from the
    archive's own tree: the changes NVIDIA's own container scripts make with sed."""
    wanted = {"DAEMONIZE": "0", "LOG_FILE_NAME": "",
              "TOPOLOGY_FILE_PATH": str(fm_dir / "share/nvidia/nvswitch")}
    lines = []
    for line in template.splitlines():
        key = line.split("=", 1)[0].strip()
        lines.append(f"{key}={wanted.pop(key)}" if key in wanted and "=" in line else line)
    lines += [f"{k}={v}" for k, v in wanted.items()]
    return "\n".join(lines) + "\n"


# NVLink5 (HGX B200/GB200, fabric.detect): NVIDIA's fabric manager reaches the switches through
# its NVLink subnet manager (nvlsm) over the switches' InfiniBand management ports: mlx5_core
# and ib_umad loaded, /dev/infiniband/umad* there. NVIDIA's driver container waits for
# mlx5_core/ib_umad (gpu-driver-container ubuntu24.04/nvidia-driver
# _ensure_nvlink5_prerequisites) and starts nvidia-fabricmanager-start.sh with nvlsm
# (_start_daemons). Missing, the fabric never completes: name it instead of waiting.
NVLSM = "nvlsm"


def nvlsm_missing(*, which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """nvlsm is the node image's (NVIDIA ships it as its own package, beside the fabric
    manager): missing now, missing for good; checked before waiting for the driver."""
    return [] if which(NVLSM) else [f"{NVLSM} (NVIDIA's NVLink subnet manager) on PATH"]


def nvlink5_missing(kernel: KernelState, *, which: Callable[[str], str | None] = shutil.which
                    ) -> list[str]:
    """What an NVLink5 node (the caller knows it is one) lacks for its fabric; empty: nothing."""
    missing = [f"the {m} kernel module (modprobe {m})" for m in ("mlx5_core", "ib_umad")
               if not kernel.is_loaded(m)]
    if not list((kernel.dev_dir / "infiniband").glob("umad*")):
        missing.append("/dev/infiniband/umad* device files")
    return missing + nvlsm_missing(which=which)
