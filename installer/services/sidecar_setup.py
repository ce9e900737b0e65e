"""What the daemon sidecars do before NVIDIA's daemon runs (commands/sidecar_cli.py is their CLI).

A sidecar starts with the pod, before the install has loaded the driver: it waits (bounded)
for the loaded driver and for the daemon's files of that very version in the install dir,
checks what the daemon needs, writes its config, then hands over to daemons.run_foreground
(the fabric manager) or forking.run_forking (nvidia-persistenced, which always forks).
"""

from __future__ import annotations

import _thread
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from installer.base.errors import VerifyError
from installer.kmod import modules
from installer.kmod.kernel import KernelState
from installer.services import fabricmanager
from installer.services.forking import pid_alive, read_pid

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
# _ensure_nvlink5_prerequisites) and starts nvlsm, then the fabric manager, through
# nvidia-fabricmanager-start.sh (_start_daemons; fabricmanager.nvlsm_argv). Missing, the fabric
# never completes: name it instead of waiting.
NVLSM = "nvlsm"
NVLSM_START_S = 30.0  # nvlsm -B: its launcher returns and its pid file names a live daemon
NVLSM_POLL_S = 1.0
NVLSM_STOP_S = 5.0  # NVIDIA's stop path: SIGTERM, 50 x 0.1 s, then SIGKILL


def nvlsm_missing(binary: str, config: str) -> list[str]:
    """nvlsm and its config are the node image's (NVIDIA ships nvlsm as its own package,
    beside the fabric manager): missing now, missing for good; checked before waiting."""
    missing = []
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        missing.append(f"{NVLSM} (NVIDIA's NVLink subnet manager) at {binary}")
    if not os.path.isfile(config):
        missing.append(f"nvlsm's config {config} (the nvlsm package's)")
    return missing


def nvlink5_missing(kernel: KernelState, bridge: str) -> list[str]:
    """What an NVLink5 node (the caller knows it is one) lacks once the driver is there."""
    missing = [f"the {m} kernel module (modprobe {m})" for m in ("mlx5_core", "ib_umad")
               if not kernel.is_loaded(m)]
    if not list((kernel.dev_dir / "infiniband").glob("umad*")):
        missing.append("/dev/infiniband/umad* device files")
    if fabricmanager.port_guid(kernel.sys_dir, bridge) is None:
        missing.append(f"the port GUID of {bridge} "
                       f"(/sys/class/infiniband/{bridge}/ports/1/gids/0)")
    return missing


def start_nvlsm(argv: list[str], pid_file: Path, env: dict[str, str], log_file: Path, *,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> int:
    """Run nvlsm's launcher (``-B``: it forks the daemon and returns) and wait, at most
    NVLSM_START_S, for its pid file to name a live daemon; its pid, else VerifyError naming
    nvlsm with its last output."""
    pid_file.unlink(missing_ok=True)
    end = clock() + NVLSM_START_S
    with log_file.open("w") as out:  # a file, not a pipe: the daemon may keep it open
        try:
            rc = subprocess.run(argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT,
                                timeout=NVLSM_START_S).returncode
        except subprocess.TimeoutExpired:
            rc = None
    while rc == 0:
        pid = read_pid(pid_file)
        if pid is not None and pid_alive(pid):
            log.info("nvlsm_started", pid=pid, argv=argv)
            return pid
        if clock() >= end:
            break
        sleep(NVLSM_POLL_S)
    said = " | ".join(log_file.read_text(errors="replace").split("\n")[-5:]).strip(" |")
    status = "did not return" if rc is None else f"exited with status {rc}" if rc else (
        f"wrote no live pid to {pid_file}")
    raise VerifyError(f"nvlsm {status} within {NVLSM_START_S:g}s: {said[-500:] or '(no output)'}",
                      hint="nvlsm's log and config (the nvlsm package's) say why; the fabric "
                      "cannot complete without it")


class NvlsmGone(BaseException):
    """Raised in the main thread (like KeyboardInterrupt, past ``except Exception``) when the
    watched nvlsm is gone; run_foreground's cleanup then stops the fabric manager."""


class NvlsmWatch:
    """Watches nvlsm while the fabric manager runs in the foreground (main thread only): when
    nvlsm goes, ``died`` says so and NvlsmGone interrupts the main thread (SIGUSR1)."""

    def __init__(self, pid: int, poll_s: float = NVLSM_POLL_S) -> None:
        self.pid, self.poll_s, self.died = pid, poll_s, ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="nvlsm-watch")
        self._previous: Any = None

    def __enter__(self) -> NvlsmWatch:
        self._previous = signal.signal(signal.SIGUSR1, self._raise)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.poll_s + 1)
        signal.signal(signal.SIGUSR1, self._previous)

    def _raise(self, _signum: int, _frame: Any) -> None:
        if self.died:
            raise NvlsmGone(self.died)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if not pid_alive(self.pid):
                self.died = (f"nvlsm (pid {self.pid}) exited: the NVLink fabric lost its "
                             "subnet manager")
                _thread.interrupt_main(signal.SIGUSR1)
                return
