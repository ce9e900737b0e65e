"""NVIDIA's Vulkan ICD file, written where GKE's DaemonSets expect it.

GKE's COS DaemonSets mount the host's ``/home/kubernetes/bin/nvidia/vulkan/icd.d``
at ``/etc/vulkan/icd.d`` and name both in ``VULKAN_ICD_DIR_HOST`` /
``VULKAN_ICD_DIR_CONTAINER``; workloads mount that dir to find the driver's
Vulkan implementation. The ``.run`` ships the file as ``nvidia_icd.json``
(from 435) or ``nvidia_icd.json.template`` with ``__NV_VK_ICD__`` standing for
the library, which distributions replace by ``libGLX_nvidia.so.0`` (resolved
through ``LD_LIBRARY_PATH=/usr/local/nvidia/lib64`` in workloads).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from installer.base import safejson
from installer.base.errors import VerifyError
from installer.base.fsutil import write_atomic
from installer.plan import Step
from installer.records.results import Extracted

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)

ICD_FILE = "nvidia_icd.json"
ICD_LIBRARY = "libGLX_nvidia.so.0"
MAX_CHARS = 1 << 16


def icd_text(extract_dir: Path) -> str | None:
    """The ICD JSON of an extracted ``.run``, or None when it has none (or a broken one)."""
    for name, raw in ((ICD_FILE, False), (ICD_FILE + ".template", True)):
        path = extract_dir / name
        if path.is_file() and not path.is_symlink():
            text = path.read_text(errors="replace")[:MAX_CHARS]
            text = text.replace("__NV_VK_ICD__", ICD_LIBRARY) if raw else text
            try:
                safejson.loads(text, max_bytes=4 * MAX_CHARS)  # UTF-8: up to 4 bytes a char
            except ValueError:
                return None
            return text
    return None


def install_icd() -> Step:
    """Before the swap (the extracted .run is still there): copy its ICD file out."""

    def run(ctx: Context) -> None:
        settings = ctx.settings
        extracted = ctx.results.get(Extracted)
        if extracted is None:  # extract_driver skipped: nothing of the .run is here
            log.warning("vulkan_icd_skipped", reason="the staging dir was filled from a "
                        "prebuilt bundle or the next-boot stage, which hold no nvidia_icd.json",
                        hint="the ICD file already in the Vulkan ICD dir, if any, stays; an "
                        "install that builds the driver writes it")
            return
        text = icd_text(extracted.extract_dir)
        if text is None:
            log.info("vulkan_icd_skipped", reason="the .run has no nvidia_icd.json")
            return
        try:
            if settings.vulkan_icd_dir is not None and settings.vulkan_icd_dir.is_dir():
                where = str(settings.vulkan_icd_dir / ICD_FILE)
                write_atomic(settings.vulkan_icd_dir / ICD_FILE, text)
            elif settings.vulkan_icd_dir_host is not None:
                where = str(settings.vulkan_icd_dir_host / ICD_FILE)
                ctx.host.write_atomic(settings.vulkan_icd_dir_host / ICD_FILE, text)
            else:
                log.warning("vulkan_icd_skipped", reason=f"{settings.vulkan_icd_dir} is not a "
                            "directory and no VULKAN_ICD_DIR_HOST names the host's")
                return
        except OSError as exc:
            raise VerifyError(
                f"cannot write the Vulkan ICD file {where}: {exc.strerror or exc}",
                hint="--vulkan-icd-dir-host (VULKAN_ICD_DIR_HOST) must name a host directory "
                "the installer can write (GKE's DaemonSets use "
                "/home/kubernetes/bin/nvidia/vulkan/icd.d)", path=where) from exc
        log.info("vulkan_icd_installed", path=where)

    return Step("vulkan_icd", run, f"copy the .run's {ICD_FILE} into the Vulkan ICD dir")


def steps_for(ctx: Context) -> tuple[Step, ...]:
    """The ICD step when a Vulkan ICD dir was given (GKE's env names it)."""
    wanted = ctx.settings.vulkan_icd_dir_host is not None or ctx.settings.vulkan_icd_dir
    return (install_icd(),) if wanted else ()
