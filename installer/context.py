"""What every step gets: a plain record of the settings and of what was detected on the
host (its OS, the kernel, the install dir), the seams (runner, HTTP session) and what
steps hand to later steps. Built by ``detect.context`` in each command; it detects
nothing itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import requests

from installer import cpuarch, gpus
from installer.cpuarch import CpuArch
from installer.gpus import PciGpu
from installer.hostroot import HostRoot
from installer.installdir import InstallDir
from installer.kernel import KernelState
from installer.net.policy import UrlPolicy
from installer.net.retry import NETWORK_DEFAULTS, TransferLimits, with_settings
from installer.net.session import make_session
from installer.osinfo import HostInfo
from installer.runner import Runner
from installer.settings import Settings
from installer.workstate import WorkState


@dataclass
class Context:
    settings: Settings
    host: HostRoot
    kernel: KernelState
    runner: Runner
    install: InstallDir
    host_info: HostInfo
    # The node's CPU architecture, read once (detect.context): the .run, the fabric
    # manager's platform and the jail's library dirs follow it.
    arch: CpuArch = cpuarch.X86_64
    # What steps hand to later steps (downloaded paths, the staging tree, ...).
    work: WorkState = field(default_factory=WorkState)
    # What this run made outside the staging dir that is worthless if it fails (the COS
    # tools dir's downloads): removed with the staging dir.
    scratch: list[Path] = field(default_factory=list)
    # Which URLs this run may fetch: every request through ``http`` follows it.
    url_policy: UrlPolicy = field(default_factory=UrlPolicy)
    _session: requests.Session | None = None
    _pci_gpus: tuple[PciGpu, ...] | None = None

    @property
    def modprobe_root(self) -> Path | None:
        """``modprobe -d``: in-tree dependencies come from the host's own module tree."""
        return None if self.host.root == Path("/") else self.host.root

    @property
    def pci_gpus(self) -> tuple[PciGpu, ...]:
        """The NVIDIA GPUs on the PCI bus, scanned once per run (the plan, its checks and
        the version choice all read them)."""
        if self._pci_gpus is None:
            self._pci_gpus = tuple(gpus.scan(self.kernel.sys_dir))
        return self._pci_gpus

    @property
    def http(self) -> requests.Session:
        """The run's HTTP session, made on first use (a cache hit makes none)."""
        if self._session is None:
            s = self.settings
            self._session = make_session(
                limits=TransferLimits(s.download_deadline_s, s.download_min_rate,
                                      s.download_min_rate_time_s),
                policy=with_settings(NETWORK_DEFAULTS, s.download_retries, s.download_timeout_s),
                url_policy=self.url_policy)
        return self._session
