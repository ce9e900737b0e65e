"""The /cos-gpu-installer shim: cos-gpu-installer v2's argv -> ours.

Flags and their rules: cos/tools src/cmd/cos_gpu_installer/internal/commands/install.go
(SetFlags L141-178, validateFlags L180-194); the commands GKE runs:
container-engine-accelerators nvidia-driver-installer/cos/daemonset-preloaded*.yaml.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from installer.base.errors import UsageError
from installer.gke.cos_gpu_installer_cli import translate

GKE_ENV = {
    "NVIDIA_INSTALL_DIR_HOST": "/home/kubernetes/bin/nvidia",
    "NVIDIA_INSTALL_DIR_CONTAINER": "/usr/local/nvidia",
    "ROOT_MOUNT_DIR": "/root",
    "COS_TOOLS_DIR_HOST": "/var/lib/cos-tools",
    "COS_TOOLS_DIR_CONTAINER": "/build/cos-tools",
}


@pytest.mark.parametrize("argv, ours", [
    # daemonset-preloaded.yaml L122, daemonset-preloaded-latest.yaml L122
    (["install"], ["install"]),
    (["install", "--version=latest"], ["install", "--driver-version", "latest"]),
    (["install", "-version", "default"], ["install", "--driver-version", "default"]),
    (["install", "-version=R535"], ["install", "--driver-version", "R535"]),
    (["install", "--version", "550.90.07"], ["install", "--driver-version", "550.90.07"]),
    (["install", "-version="], ["install"]),  # empty: v2's default
    (["install", "-prepare-build-tools"], ["install", "--preload"]),
    (["install", "-debug=true", "-allow-unsigned-driver=false"], ["install", "--verbose"]),
    (["-logtostderr", "-v=2", "install"], ["install", "--verbose"]),
    (["install", "-module-arg", "nvidia.NVreg_EnableGpuFirmware=0",
      "--module-arg=nvidia_uvm.uvm_debug_prints=1"],
     ["install", "--module-arg", "nvidia.NVreg_EnableGpuFirmware=0",
      "--module-arg", "nvidia_uvm.uvm_debug_prints=1"]),
    (["install", "-host-dir=/home/kubernetes/bin/nvidia"], ["install"]),
    (["install", "-host-dir=/var/lib/nvidia"],
     ["install", "--install-dir-host", "/var/lib/nvidia", "--install-dir", "/root/var/lib/nvidia"]),
    (["install", "-gcs-download-bucket=cos-tools-eu"],
     ["install", "--cos-artifacts-url", "https://storage.googleapis.com/cos-tools-eu/{build_id}/{board}"]),
    (["install", "-gcs-download-prefix", "17800.66.78/lakitu"],
     ["install", "--cos-artifacts-url",
      "https://storage.googleapis.com/cos-tools/17800.66.78/lakitu"]),
    (["install", "-allow-unsigned-driver", "-nvidia-installer-url=https://x.test/N.run"],
     ["install", "--driver-url", "https://x.test/N.run"]),
    # GKE's confidential-node DaemonSet, which loads the modules itself.
    (["install", "--no-verify", "--version=default"],
     ["install", "--driver-version", "default", "--install-only"]),
])
def test_v2_argv_maps_to_ours(argv, ours):
    assert translate(argv, GKE_ENV) == ours


@pytest.mark.parametrize("argv, named", [
    (["install", "-test"], "-test"),
    (["install", "-signature-url=https://x.test/s.tgz"], "-signature-url"),
    (["install", "-version=1", "-nvidia-installer-url-open=https://x.test/o.run"],
     "-nvidia-installer-url-open"),
    (["install", "-frobnicate"], "-frobnicate"),
    (["install", "-debug=maybe"], "-debug"),
    (["install", "-version"], "-version"),
    (["install", "-nvidia-installer-url=https://x.test/N.run"], "-allow-unsigned-driver"),
    (["install", "-version=1.2", "-allow-unsigned-driver",
      "-nvidia-installer-url=https://x.test/N.run"], "mutually exclusive"),
    (["install", "-gcs-download-bucket=https://evil.test/"], "-gcs-download-bucket"),
    (["install", "-gcs-download-prefix=../../x"], "-gcs-download-prefix"),
    (["list"], "'list'"),
    (["install", "stray"], "'stray'"),
    ([], "no command"),
])
def test_refused_flags_name_themselves(argv, named):
    with pytest.raises(UsageError) as exc:
        translate(argv, GKE_ENV)
    assert named in str(exc.value)


def test_entry_refuses_with_exit_2_and_one_line():
    proc = subprocess.run(
        [sys.executable, "-c", "from installer.gke.cos_gpu_installer_cli import main; main()",
         "install", "-test"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "-test" in proc.stderr


@pytest.mark.parametrize("argv", [["install", "--help"], ["install", "-h"],
                                  ["install", "--version=latest", "-help"], ["help", "install"],
                                  ["--help"]])
def test_help_anywhere_prints_the_usage(argv):
    proc = subprocess.run(
        [sys.executable, "-c", "from installer.gke.cos_gpu_installer_cli import main; main()",
         *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: /cos-gpu-installer install") and proc.stderr == ""
