"""What every step gets: settings, the host, the kernel, a runner, the install dir."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from installer.distros import host_info_from_text
from installer.errors import UnsupportedHostError, clip
from installer.hostroot import HostRoot
from installer.installdir import InstallDir
from installer.kernel import KernelState
from installer.osinfo import HostInfo
from installer.runner import Runner
from installer.settings import DEFAULT_HOST_ROOT, Settings
from installer.values import is_kernel_release
from installer.workstate import WorkState

if TYPE_CHECKING:
    import requests

UNKNOWN_FAMILY = "unknown"


@dataclass
class Context:
    settings: Settings
    host: HostRoot
    kernel: KernelState
    runner: Runner
    install: InstallDir
    host_info: HostInfo
    # What steps hand to later steps (downloaded paths, the staging tree, ...).
    work: WorkState = field(default_factory=WorkState)
    # What this run made outside the staging dir that is worthless if it fails (the COS
    # tools dir's downloads): removed with the staging dir.
    scratch: list[Path] = field(default_factory=list)
    _session: requests.Session | None = None

    @classmethod
    def from_settings(cls, settings: Settings, kernel: KernelState | None = None,
                      runner: Runner | None = None, *, strict: bool = True) -> Context:
        """The one way every command (and every test) builds its context.

        ``kernel`` and ``runner`` are the seams tests replace. Not ``strict``: a host
        whose OS cannot be told gets ``UNKNOWN_FAMILY`` instead of an error (doctor and
        uninstall still work there).
        """
        assert settings.install_dir is not None, "settings must be resolved"
        host = HostRoot(settings.host_root)
        kernel = kernel or KernelState()
        release = settings.kernel_release or kernel.release()
        try:
            if not is_kernel_release(release):  # --kernel-release is checked in settings
                raise UnsupportedHostError(
                    f"the running kernel's release {clip(release)!r} (uname -r) is not a "
                    "kernel release: it names the headers, modules and cache to use",
                    hint="pass the node's real release with --kernel-release (KERNEL_RELEASE), "
                    f"or check {kernel.proc_dir}/sys/kernel/osrelease",
                    kernel_release=clip(release))
            host_info = detect(host, release)
        except UnsupportedHostError:
            if strict:
                raise
            host_info = HostInfo(UNKNOWN_FAMILY, UNKNOWN_FAMILY, "", UNKNOWN_FAMILY, release)
        return cls(settings=settings, host=host, kernel=kernel, runner=runner or Runner(),
                   install=InstallDir(settings.install_dir, settings.install_dir_host),
                   host_info=host_info)

    @property
    def modprobe_root(self) -> Path | None:
        """``modprobe -d``: in-tree dependencies come from the host's own module tree."""
        return None if self.host.root == Path("/") else self.host.root

    @property
    def http(self) -> requests.Session:
        if self._session is None:
            from installer.net.retry import NETWORK_DEFAULTS, TransferLimits, with_settings
            from installer.net.session import make_session  # requests is slow to import

            s = self.settings
            self._session = make_session(
                limits=TransferLimits(s.download_deadline_s, s.download_min_rate,
                                      s.download_min_rate_time_s),
                policy=with_settings(NETWORK_DEFAULTS, s.download_retries, s.download_timeout_s))
        return self._session


def detect(host: HostRoot, kernel_release: str) -> HostInfo:
    """The host's OS from its os-release and lsb-release."""
    os_release = host.read_text("/etc/os-release")
    if os_release is None and _run_by_hand_on_the_node(host):
        raise UnsupportedHostError(
            f"cannot read {host.path('/etc/os-release')}: --host-root is {host.root}, but this "
            "runs on the node itself, not in the installer's pod",
            hint="pass --host-root / (or ROOT_MOUNT_DIR=/) when running on the node by hand",
            path=str(host.path("/etc/os-release")))
    return host_info_from_text(
        os_release,
        host.read_text("/etc/lsb-release"),
        kernel_release,
        os_release_path=str(host.path("/etc/os-release")),
    )


# Files container runtimes create in every container (docker, podman / CRI-O).
CONTAINER_MARKERS = (Path("/.dockerenv"), Path("/run/.containerenv"))


def _run_by_hand_on_the_node(host: HostRoot) -> bool:
    """The default --host-root /root, outside any container (so / is the host's own)."""
    return (host.root == DEFAULT_HOST_ROOT and Path("/etc/os-release").is_file()
            and not any(m.exists() for m in CONTAINER_MARKERS)
            and "KUBERNETES_SERVICE_HOST" not in os.environ)
