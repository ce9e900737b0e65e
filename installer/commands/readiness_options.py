"""The options of what "ready" means (docs/node-shapes.md), for install and verify: the fabric gate
(NVSwitch nodes), the CUDA check and its way out, the daemon sidecars; and where install
gets the fabric manager from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from installer.base import podcontract
from installer.commands.click_types import Seconds
from installer.driver.nvidia_urls import FABRIC_MANAGER_BASE_URL


def readiness_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """install and verify: the fabric gate (NVSwitch nodes), the CUDA check
    (installer/services/cuda_check.py) and its way out."""
    fn = click.option("--require-daemon", "required_daemons", multiple=True,
                      type=click.Choice(list(podcontract.DAEMON_NAMES)),
                      envvar="NVIDIA_REQUIRED_DAEMONS", show_envvar=True,
                      help="A daemon sidecar that must report running before the driver is "
                      "ready (repeatable; the env var: space-separated). manifests render sets "
                      "it for the sidecars it adds.")(fn)
    fn = click.option("--fabric-deadline", "fabric_deadline_s", type=Seconds(open_min=True),
                      envvar="NVIDIA_FABRIC_DEADLINE", default=600, show_default=True,
                      show_envvar=True,
                      help="NVSwitch nodes: how long every GPU's NVLink fabric may take to "
                      "reach Completed (the fabric manager sidecar trains it) before the "
                      "verify fails (exit 9).")(fn)
    fn = click.option("--cuda-check-deadline", "cuda_check_deadline_s",
                      type=Seconds(open_min=True), envvar="NVIDIA_CUDA_CHECK_DEADLINE",
                      default=60, show_default=True, show_envvar=True,
                      help="How long the CUDA check may take before it is stopped and the "
                      "verify fails (exit 9): a hung cuInit cannot hang the installer.")(fn)
    fn = click.option("--cc-set-ready", is_flag=True, envvar="NVIDIA_CC_SET_READY",
                      show_envvar=True,
                      help="Confidential-computing GPUs (H100 CC mode on): set the GPUs' ready "
                      "state (`nvidia-smi conf-compute -srs 1`, once persistenced is up) "
                      "before the CUDA check. It changes a GPU setting: only on your say, "
                      "after you have attested the GPUs.")(fn)
    return click.option("--skip-cuda-check", is_flag=True, envvar="NVIDIA_SKIP_CUDA_CHECK",
                        show_envvar=True,
                        help="Verify with nvidia-smi only, making no CUDA context (nodes "
                        "where one must not be made). Risk: \"verified\" then does not mean a "
                        "CUDA program runs (an NVSwitch fabric not ready, missing UVM files, "
                        "a GPU in exclusive mode all pass nvidia-smi).")(fn)


def fabric_manager_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """install: NVIDIA's fabric manager archive for NVSwitch nodes (fabricmanager.py)."""
    fn = click.option("--fabric-manager-sha256", envvar="NVIDIA_FABRIC_MANAGER_SHA256",
                      show_envvar=True,
                      help="NVSwitch nodes: the fabric manager archive's SHA-256 [default: "
                      "from redistrib_<V>.json].")(fn)
    return click.option("--fabric-manager-base-url", envvar="NVIDIA_FABRIC_MANAGER_BASE_URL",
                        show_envvar=True, default=FABRIC_MANAGER_BASE_URL, show_default=True,
                        help="NVSwitch nodes: where fabricmanager/linux-x86_64/fabricmanager-"
                        "linux-x86_64-<V>-archive.tar.xz and redistrib_<V>.json are (NVIDIA's "
                        "redistributable area, or a mirror of it).")(fn)
