"""Issue 22 item 8: the privileged CLI obeys no env var that moves its view of the kernel.

Before, ``NVIDIA_INSTALLER_{PROC,SYS,DEV}_DIR`` made the installed CLI read a planted
/proc, /sys and /dev: whoever set the pod's env could show it any loaded driver and any
kernel, and have it hand those paths on to nvidia-modprobe. Now only the test harness moves
them, in-process (installer.kmod.kernel.use_roots through tests/fixtures/kernelhook).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PLANTED_RELEASE = "6.6.6-planted"
PLANTED_DRIVER = "999.99.99"


def _plant(tmp_path) -> dict[str, str]:
    proc, sys_dir, dev = tmp_path / "proc", tmp_path / "sys", tmp_path / "dev"
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "sys/kernel/osrelease").write_text(PLANTED_RELEASE + "\n")
    (proc / "modules").write_text("nvidia 56147968 0 - Live 0x0000000000000000 (POE)\n")
    (sys_dir / "module/nvidia").mkdir(parents=True)
    (sys_dir / "module/nvidia/version").write_text(PLANTED_DRIVER + "\n")
    dev.mkdir()
    return {"NVIDIA_INSTALLER_PROC_DIR": str(proc), "NVIDIA_INSTALLER_SYS_DIR": str(sys_dir),
            "NVIDIA_INSTALLER_DEV_DIR": str(dev)}


def test_the_installed_cli_reads_the_real_kernel_whatever_its_env_says(tmp_path):
    host = tmp_path / "host"
    (host / "etc").mkdir(parents=True)
    (host / "etc/os-release").write_text('ID=ubuntu\nVERSION_ID="22.04"\n')
    env = {"PATH": os.environ["PATH"], **_plant(tmp_path)}  # no test hook on PYTHONPATH
    proc = subprocess.run([sys.executable, "-m", "installer", "detect", "--host-root",
                           str(host), "-o", "json", "--log-format", "json"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    detected = json.loads(proc.stdout)
    assert detected["kernel_release"] == os.uname().release
    assert detected["loaded_driver_version"] != PLANTED_DRIVER
    assert PLANTED_RELEASE not in proc.stdout + proc.stderr
