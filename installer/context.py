"""What every step gets: settings, the host, the kernel, a runner, the install dir."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from installer.hostroot import HostRoot
from installer.installdir import InstallDir
from installer.kernel import KernelState
from installer.osinfo import HostInfo
from installer.runner import Runner
from installer.settings import Settings
from installer.workstate import WorkState

if TYPE_CHECKING:
    import requests


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

    @property
    def http(self) -> requests.Session:
        if self._session is None:
            from installer.download import make_session  # requests is slow to import
            from installer.retry import TransferLimits

            s = self.settings
            self._session = make_session(limits=TransferLimits(
                s.download_deadline_s, s.download_min_rate, s.download_min_rate_time_s))
        return self._session
