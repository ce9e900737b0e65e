"""What steps hand to later steps during one run, typed: each field is set by one step
(named in its comment) and read by later ones."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from installer.kmod.moduleargs import ModuleArg
from installer.kmod.modules import InUse as InUse  # re-exported: what a staged plan holds
from installer.records import readiness

if TYPE_CHECKING:
    from installer.host.gpus import Gpu
    from installer.host.installdir import Tree
    from installer.kmod.headers import KernelTree
    from installer.net.transfer import Downloaded
    from installer.records.bundle_manifest import Manifest, Written

# What a fetch step downloads (the plan's Fetch.artifact).
Artifact = Literal["driver", "prebuilt", "signatures", "headers", "toolchain"]


@dataclass(frozen=True)
class BuildToolchain:
    """A toolchain the distro provides for the kernel module build (COS: its cross
    toolchain); the shared build step uses it without knowing where it came from."""

    env: dict[str, str]  # CC, CXX, PATH, ... for nvidia-installer
    # (container path, sandbox path) dirs the sandbox must show (a separate mount)
    binds: tuple[tuple[str, str], ...] = ()


@dataclass
class NodeChanges:
    """What this run changed on the node, each field set by the step named."""

    unloaded_version: str | None = None  # unload_other_driver
    firmware_path_before: str | None = None  # gpu_firmware: firmware_class.path before
    loaded: list[str] = field(default_factory=list)  # load_modules: modules inserted
    promoted: bool = False  # promote: the old layout waits in .previous until record_cache
    device_files_before: frozenset[str] | None = None  # device_nodes: /dev entries before
    committed: bool = False  # record_cache: the new install is verified and recorded

    def note_firmware_path(self, current: str | None) -> None:
        if self.firmware_path_before is None:
            self.firmware_path_before = current

    def note_device_files(self, dev_dir: Path) -> None:
        if self.device_files_before is None:
            self.device_files_before = device_files(dev_dir)


def device_files(dev_dir: Path) -> frozenset[str]:
    """The NVIDIA device files and /dev/char links, relative to ``dev_dir``; the
    ``nvidia-caps/`` dir (nvidia-modprobe -c, NVML) with the files in it."""
    found = set()
    for path in dev_dir.glob("nvidia*"):
        found.add(path.name)
        if path.is_dir() and not path.is_symlink():
            found |= {f"{path.name}/{inner.name}" for inner in path.iterdir()}
    char = dev_dir / "char"
    if char.is_dir():
        found |= {f"char/{p.name}" for p in char.iterdir()
                  if p.is_symlink() and os.readlink(p).startswith("../nvidia")}
    return frozenset(found)


@dataclass
class WorkState:
    staging: Tree | None = None  # prepare_staging
    downloads: dict[Artifact, Downloaded] = field(default_factory=dict)  # fetch_artifacts
    run_file: Path | None = None  # download_driver / fetch_artifacts
    extract_dir: Path | None = None  # extract_driver
    kernel_tree: KernelTree | None = None  # the distro's kernel headers step
    toolchain: BuildToolchain | None = None  # the distro's toolchain step (COS)
    prebuilt_dir: Path | None = None  # unpack_prebuilt / link_precompiled (COS)
    signatures_dir: Path | None = None  # unpack_signatures (COS)
    kernel_module_type: str | None = None  # check_gpu_compatibility
    # check_gpu_compatibility, --dry-run on a machine without an NVIDIA GPU: what the real run
    # here would end in (the plan is still printed: a plan previewed from a workstation or CI).
    no_gpu: str | None = None
    changes: NodeChanges = field(default_factory=NodeChanges)  # what rollback.undo reverses
    gpus: list[Gpu] | None = None  # verify (None: no verify ran, as with --preload)
    bundle: Manifest | None = None  # fetch_prebuilt_bundle: the staged tree came from it
    from_next_boot: bool = False  # take_next_boot: the staged tree is the one kept for it
    staged_for_boot: InUse | None = None  # stage_next_boot: kept aside, not installed
    # apply_module_args: what holds the loaded driver, so NVIDIA_MODULE_ARGS wait for its
    # next load (None: nothing waits).
    module_args_waiting: str | None = None
    # This boot's readiness file as install found it before clearing it (None: there was
    # none); rollback.undo puts it back when the node is as it was.
    readiness_before: str | None = None

    @property
    def module_args_loaded(self) -> tuple[ModuleArg, ...] | None:
        """The NVIDIA_MODULE_ARGS the loaded driver was loaded with, per this boot's
        readiness file (None: unknown, e.g. loaded by someone else). What the kernel runs
        with is modules.loaded_params; this says which of those were asked for:
        apply_module_args (an argument dropped since) and the rollback read it."""
        if self.readiness_before is None:
            return None
        return readiness.loaded_module_args(readiness.parse(self.readiness_before))
    bundle_written: Written | None = None  # write_bundle (bundle build)
    persistence_mode: str = "off"  # persistence_mode: "on" or "failed" when it ran
    # verify: each readiness check's result by its driver-ready key (verify.CHECKS)
    checks: dict[str, str] = field(default_factory=dict)

    def staged(self) -> Tree:
        assert self.staging is not None, "prepare_staging runs first"
        return self.staging
