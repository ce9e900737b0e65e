"""Find the kernel source tree the NVIDIA installer builds against.

Debian and Ubuntu split the headers of kernel ``<r>`` into a source dir
(``linux-headers-<X>-common``, ``/lib/modules/<r>/source``) and a kbuild output
dir (``linux-headers-<r>``, ``/lib/modules/<r>/build``) whose Makefile is one
``include <source>/Makefile`` line. nvidia-installer given only one path uses
it for both (``determine_kernel_output_path``) and NVIDIA's conftest then fails
(``dma_buf_export() conftest failed``), so both are found and passed.
"""

from __future__ import annotations

import re
from pathlib import Path

import structlog

from installer.base.dataclass import dataclass
from installer.base.errors import BuildError
from installer.host.hostroot import HostRoot
from installer.host.runner import CommandError, Runner

log = structlog.get_logger(__name__)

APT_TIMEOUT_S = 900


_INCLUDE = re.compile(r"^include\s+(/\S+)/Makefile\s*$", re.M)
MAKEFILE_READ_LIMIT = 4096  # an output dir's Makefile is one or two lines


@dataclass(frozen=True)
class KernelTree:
    source: Path  # this process's view; the same path inside the build sandbox
    output: Path  # == source for an unsplit tree (COS, a kernel build dir)

    def describe(self) -> str:
        return str(self.source) if self.output == self.source else f"{self.source} (output {self.output})"


def is_kernel_tree(path: Path) -> bool:
    return (path / "Makefile").is_file()


def included_source(makefile_text: str) -> str | None:
    """``include /usr/src/linux-headers-6.1.0-56-common/Makefile`` -> that dir (a kbuild
    output dir's Makefile); None for a full kernel Makefile."""
    match = _INCLUDE.search(makefile_text)
    return match.group(1) if match else None


def split_tree(host: HostRoot, tree: Path) -> KernelTree:
    """The source dir of an output dir ``tree`` (host paths resolved inside the host
    root when ``tree`` is on the host), else ``tree`` for both."""
    try:
        with open(tree / "Makefile", "rb") as f:
            text = f.read(MAKEFILE_READ_LIMIT).decode(errors="replace")
    except OSError:
        return KernelTree(tree, tree)
    named = included_source(text)
    if named is None:
        return KernelTree(tree, tree)
    on_host = tree.resolve().is_relative_to(host.root) and host.root != Path("/")
    source = host.resolve(named) if on_host else Path(named)
    if not is_kernel_tree(source) or source.resolve() == tree.resolve():
        return KernelTree(tree, tree)
    return KernelTree(source, tree)


def candidates(host: HostRoot, release: str) -> list[tuple[str, Path]]:
    """Where the headers may already be, in order: (what we looked at, container path)."""
    return [
        (f"/usr/src/linux-headers-{release}", host.resolve(f"/usr/src/linux-headers-{release}")),
        (f"/lib/modules/{release}/build", host.resolve(f"/lib/modules/{release}/build")),
    ]


def find_on_host(host: HostRoot, release: str,
                 explicit: Path | None) -> tuple[KernelTree | None, list[str]]:
    tried: list[str] = []
    if explicit is not None:
        if is_kernel_tree(explicit):
            return split_tree(host, explicit), tried
        tried.append(f"{explicit} (--kernel-source-path: no Makefile)")
        return None, tried
    for label, path in candidates(host, release):
        if is_kernel_tree(path):
            return split_tree(host, path), tried
        tried.append(f"host {label}")
    return None, tried


def apt_install(runner: Runner, host: HostRoot, release: str, tried: list[str]) -> KernelTree:
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
    return split_tree(host, path)


def not_found(release: str, tried: list[str]) -> BuildError:
    return BuildError(
        f"no kernel headers for kernel {release}; tried: " + "; ".join(tried),
        hint=f"install linux-headers-{release} on the node, or pass --kernel-source-path",
        kernel_release=release,
    )
