"""What doctor's checks read (the ``Node``) and give (``Finding``), and advice they share."""

from __future__ import annotations

from dataclasses import field
from pathlib import Path

from installer import distros
from installer.base.dataclass import dataclass
from installer.base.errors import InstallerError
from installer.base.fsutil import UnreadableFile
from installer.detect import context, probe
from installer.distros.base import Distro
from installer.host import gpus
from installer.host.gpus import Gpu
from installer.host.hostroot import HostRoot
from installer.host.installdir import InstallDir
from installer.host.osinfo import HostInfo
from installer.host.runner import Runner
from installer.kmod import modules
from installer.kmod.kernel import KernelState
from installer.records import cache
from installer.records import status as status_file
from installer.records.outcome import UNINSTALLED, Outcome
from installer.services.verify import nvidia_smi
from installer.settings import Settings

OK, WARN, FAIL = "ok", "warn", "fail"  # a finding's verdict
LIBS = ("libcuda.so.1", "libnvidia-ml.so.1")

# What to do on a node install has never run on (no status, no record, no driver files).
INSTALL_FIRST = ("install the driver: apply the installer DaemonSet (docs/operator/"
                 "install.md), or on the node itself: sudo "
                 "nvidia-driver-installer install --host-root /")

SWITCH_FROM_GKE = ("keep one installer: delete GKE's DaemonSet (kubectl -n kube-system delete "
                   "daemonset nvidia-driver-installer), and create GPU node pools with "
                   "gpu-driver-version=disabled (docs/operator/gke.md)")

DRAIN = ("drain GPU workloads from the node (kubectl drain <node> --ignore-daemonsets "
         "--delete-emptydir-data), then re-run install")
# The README's runbook for a staged version: nothing to re-run, the reboot installs it.
REBOOT_STAGED = ("drain the node (kubectl drain <node> --ignore-daemonsets "
                 "--delete-emptydir-data), reboot it, then kubectl uncordon <node>")
INSTALL_AGAIN = "run install to install it again"


@dataclass(frozen=True)
class Finding:
    check: str
    verdict: str  # ok | warn | fail
    detail: str
    fix: str = ""


@dataclass
class Node:
    """What the checks read: what detection found, and what is read once (status,
    cache record, GPUs)."""

    host: HostRoot
    kernel: KernelState
    runner: Runner
    install: InstallDir
    detected: HostInfo  # HostInfo.unknown() where the OS cannot be told
    status: Outcome | None = None
    status_unreadable: str | None = None  # why status.json could not be read
    record: cache.CacheRecord | None = None
    pci: list[gpus.PciGpu] = field(default_factory=list)
    _smi: list[Gpu] | InstallerError | None = None

    @property
    def host_info(self) -> HostInfo | None:
        return self.detected if self.detected.known else None

    @property
    def distro(self) -> type[Distro] | None:
        return distros.by_name(self.host_info.distro) if self.host_info is not None else None

    @property
    def kernel_release(self) -> str:
        return self.detected.kernel_release

    @property
    def loaded_version(self) -> str | None:
        return modules.loaded_driver_version(self.kernel)

    @property
    def node_image_driver(self) -> bool:
        """A driver is loaded that this tool never installed here (no status.json, no .cache
        record): the node image's, e.g. GKE's on a read-only /usr/local/nvidia (a real H100
        node: tests/data/gpu-node). Its files are not ours to judge as an install."""
        return (self.loaded_version is not None and self.status is None
                and self.status_unreadable is None and self.record is None)

    def smi(self) -> list[Gpu] | InstallerError:
        """nvidia-smi's GPUs, or why it failed; run once per doctor."""
        if self._smi is None:
            try:
                self._smi = nvidia_smi(self.install, self.runner,
                                       lib_dir=self.install.lib64)
            except InstallerError as exc:
                self._smi = exc
        return self._smi

    def image_driver(self) -> str:
        """'driver V loaded by the node image; not installed by this tool; nvidia-smi ...'"""
        smi = self.smi()
        works = ("nvidia-smi works" if not isinstance(smi, InstallerError)
                 else f"nvidia-smi fails ({smi.message})")
        return (f"driver {self.loaded_version} loaded by the node image; not installed by "
                f"this tool; {works}")

    @property
    def uninstalled(self) -> str | None:
        """When `uninstall` removed the install (its status.json says so), else None."""
        if self.status is not None and self.status.outcome == UNINSTALLED and self.record is None:
            return self.status.finished_at or "?"
        return None

    @property
    def rerun_install(self) -> str:
        """How advice names running install: "run install" where nothing is installed (never,
        or `uninstall` removed it), so no fix suggests a run happened; else "re-run install"."""
        return "run install" if self.never_installed or self.uninstalled else "re-run install"

    @property
    def never_installed(self) -> bool:
        """No status.json, no .cache record and no driver file: install has never run here
        (so "re-run" and "--force" advice would mislead)."""
        return (self.status is None and self.status_unreadable is None and self.record is None
                and self.loaded_version is None
                and not any(count_files(self.install.root / d) for d in ("bin", "lib64", "drivers")))


def load(settings: Settings) -> Node:
    ctx = probe(context(settings, strict=False))  # the node as install's plan would see it
    node = Node(ctx.host, ctx.kernel, ctx.runner, ctx.install, ctx.host_info,
                record=ctx.node.installed, pci=list(ctx.node.pci_gpus))
    try:
        node.status = status_file.read(node.install.status_file)
    except UnreadableFile as exc:  # reported by check_installer_status, never a hang
        node.status_unreadable = f"status.json {exc.reason}"
    return node


def count_files(d: Path) -> int:
    try:
        return sum(1 for _ in d.iterdir())
    except OSError:
        return 0
