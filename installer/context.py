"""What every step gets: a plain record of the settings and of what was detected on the
host (its OS, the kernel, the install dir), the seams (runner, HTTP session) and what
steps hand to later steps (their results, collected by the executor) and the journal of what
the run changed. Built by ``detect.context`` in each command; it detects
nothing itself."""

from __future__ import annotations

from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING

from installer.base import cpuarch
from installer.base.cpuarch import CpuArch
from installer.base.dataclass import dataclass
from installer.host import gpus
from installer.host.gpus import PciGpu
from installer.host.hostroot import HostRoot
from installer.host.installdir import InstallDir
from installer.host.osinfo import HostInfo
from installer.host.runner import Runner
from installer.kmod.kernel import KernelState
from installer.kmod.signing import SigningPolicy
from installer.net.policy import UrlPolicy
from installer.net.retry import NETWORK_DEFAULTS, TransferLimits, with_settings
from installer.records.cache import CacheRecord
from installer.records.journal import Journal
from installer.records.results import Results
from installer.settings import Settings

if TYPE_CHECKING:
    from installer.net.session import ArtifactSession


@dataclass(frozen=True)
class NodeProbe:
    """The node as planning sees it, read once before any plan (``detect.probe``, under the
    install's lock): planners read this, never the node, so a plan and its --dry-run lines
    follow from the settings and this record."""

    pci_gpus: tuple[PciGpu, ...]  # the NVIDIA GPUs on the PCI bus
    fabric_present: bool  # an NVLink fabric (fabric.detect: NVSwitch gen 2/3, NVLink5)
    installed: CacheRecord | None  # the install dir's .cache record (None: none, unreadable)
    loaded_driver: str | None  # the loaded nvidia.ko's version (None: none loaded)
    # What keeps the loaded driver (holders, or why the kernel unloads nothing), read only
    # when a plan may have to leave it running (--when-in-use stage, or a kernel that cannot
    # unload; never with --install-only); None: unused, or not asked.
    held_by: str | None
    signing: SigningPolicy  # whether the kernel loads only signed modules
    nvidia_params: str | None  # /proc/driver/nvidia/params (None: no driver loaded)
    # The loaded driver's GPU minors (/proc/driver/nvidia/gpus; None: not all known)
    driver_minors: tuple[int, ...] | None


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
    # What the steps run so far returned, in plan order (plan.run_step adds each).
    results: Results = field(default_factory=Results)
    # What this run changed on the node, noted as each change is made: rollback.undo's input.
    journal: Journal = field(default_factory=Journal)
    # Which URLs this run may fetch: every request through ``http`` follows it.
    url_policy: UrlPolicy = field(default_factory=UrlPolicy)
    # The node as planning sees it (detect.probe); None until probed (commands that plan
    # nothing never probe).
    probe: NodeProbe | None = None
    # install --dry-run --gpu-model: the GPU planning assumes on a bus without one
    # (detect.probe puts it in the probe; nothing else reads or writes the node for it).
    assumed_gpus: tuple[PciGpu, ...] = ()
    _session: ArtifactSession | None = None
    _pci_gpus: tuple[PciGpu, ...] | None = None

    @property
    def node(self) -> NodeProbe:
        """The probe planners read (detect.probe makes it before any plan)."""
        if self.probe is None:
            raise AssertionError("planning reads the node through detect.probe(ctx)")
        return self.probe

    @property
    def modprobe_root(self) -> Path | None:
        """``modprobe -d``: in-tree dependencies come from the host's own module tree."""
        return None if self.host.root == Path("/") else self.host.root

    @property
    def pci_gpus(self) -> tuple[PciGpu, ...]:
        """The NVIDIA GPUs on the PCI bus, scanned once per run (the plan, its checks and
        the version choice all read them)."""
        if self.probe is not None:
            return self.probe.pci_gpus
        if self._pci_gpus is None:
            self._pci_gpus = tuple(gpus.scan(self.kernel.sys_dir))
        return self._pci_gpus

    @property
    def http(self) -> ArtifactSession:
        """The run's HTTP session, made on first use (a cache hit makes none)."""
        if self._session is None:
            # Imported here: the session module imports requests, which a run that fetches
            # nothing (a cache hit, every boot) must not load (installer/net/__init__.py).
            from installer.net.session import make_session

            s = self.settings
            self._session = make_session(
                limits=TransferLimits(s.download_deadline_s, s.download_min_rate,
                                      s.download_min_rate_time_s),
                policy=with_settings(NETWORK_DEFAULTS, s.download_retries, s.download_timeout_s),
                url_policy=self.url_policy)
        return self._session
