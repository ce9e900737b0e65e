"""Find the kernel source tree the NVIDIA installer builds against."""

from __future__ import annotations

from pathlib import Path

import structlog

from installer.errors import BuildError
from installer.hostroot import HostRoot
from installer.runner import CommandError, Runner

log = structlog.get_logger(__name__)

APT_TIMEOUT_S = 900


def is_kernel_tree(path: Path) -> bool:
    return (path / "Makefile").is_file()


def candidates(host: HostRoot, release: str) -> list[tuple[str, Path]]:
    """Where the headers may already be, in order: (what we looked at, container path)."""
    return [
        (f"/usr/src/linux-headers-{release}", host.resolve(f"/usr/src/linux-headers-{release}")),
        (f"/lib/modules/{release}/build", host.resolve(f"/lib/modules/{release}/build")),
    ]


def find_on_host(host: HostRoot, release: str, explicit: Path | None) -> tuple[Path | None, list[str]]:
    tried = []
    if explicit is not None:
        if is_kernel_tree(explicit):
            return explicit, tried
        tried.append(f"{explicit} (--kernel-source-path: no Makefile)")
        return None, tried
    for label, path in candidates(host, release):
        if is_kernel_tree(path):
            return path, tried
        tried.append(f"host {label}")
    return None, tried


def apt_install(runner: Runner, release: str, tried: list[str]) -> Path:
    """Install linux-headers-<release> in this (Ubuntu) container with apt."""
    package = f"linux-headers-{release}"
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    try:
        runner.run(["apt-get", "update", "-qq"], timeout=APT_TIMEOUT_S, env=env)
        runner.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", package],
                   timeout=APT_TIMEOUT_S, env=env)
    except CommandError as exc:
        tried.append(f"apt-get install {package}: {exc.stderr_tail(1)}")
        raise not_found(release, tried) from exc
    path = Path(f"/usr/src/linux-headers-{release}")
    if not is_kernel_tree(path):
        tried.append(f"{path} after apt-get")
        raise not_found(release, tried)
    log.info("kernel_headers_installed", package=package, path=str(path))
    return path


def not_found(release: str, tried: list[str]) -> BuildError:
    return BuildError(
        f"no kernel headers for kernel {release}; tried: " + "; ".join(tried),
        hint=f"install linux-headers-{release} on the node, or pass --kernel-source-path",
        kernel_release=release,
    )
