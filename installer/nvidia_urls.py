"""Where NVIDIA's Linux driver .run files are and what they are called."""

from __future__ import annotations

import re

NVIDIA_BASE_URL = "https://us.download.nvidia.com/{branch}"
DEFAULT_DRIVER_BASE_URL = NVIDIA_BASE_URL.format(branch="tesla")

_RUN_NAME = re.compile(r"NVIDIA-Linux-x86_64-(\d[\d.]*\d)(?:-[\w.]+)?\.run$")


def run_file_name(version: str) -> str:
    return f"NVIDIA-Linux-x86_64-{version}.run"


def run_url(base: str, version: str) -> str:
    """``<base>/<V>/NVIDIA-Linux-x86_64-<V>.run``, NVIDIA's layout (and its mirrors')."""
    return f"{base.rstrip('/')}/{version}/{run_file_name(version)}"


def named_version(url: str) -> str | None:
    """The driver version a .run URL's file name names, if it does."""
    match = _RUN_NAME.search(url.split("?", 1)[0])
    return match.group(1) if match else None
