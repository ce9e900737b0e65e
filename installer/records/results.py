"""What steps hand to later steps: each step returns one frozen result (or nothing), the
plan's executor collects them in plan order (``Results``), and later steps and the
command's outcome read them by type. What a run changed on the node is not here but in
the journal (records/journal.py), written as each change is made."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from installer.base.dataclass import dataclass
from installer.kmod.modules import InUse as InUse  # re-exported: what a staged plan holds

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


class StepResult:
    """What one step hands on; each kind below names the steps that return it. A plain
    base, not a dataclass: it has no fields, and a dataclass base would send each kind to
    the standard library's slower build (installer/base/dataclass.py)."""


@dataclass(frozen=True)
class Staged(StepResult):
    """prepare_staging: the empty staging tree the build fills."""

    tree: Tree


@dataclass(frozen=True)
class Fetched(StepResult):
    """download_driver, fetch_artifacts: what each artifact was downloaded to."""

    files: Mapping[Artifact, Downloaded]


@dataclass(frozen=True)
class Extracted(StepResult):
    """extract_driver: where the .run is unpacked."""

    extract_dir: Path


@dataclass(frozen=True)
class HeadersReady(StepResult):
    """The distro's kernel headers step (find_kernel_headers, prepare_kernel_headers)."""

    tree: KernelTree


@dataclass(frozen=True)
class ToolchainReady(StepResult):
    """prepare_toolchain (COS)."""

    toolchain: BuildToolchain


@dataclass(frozen=True)
class SignaturesUnpacked(StepResult):
    """unpack_signatures (COS)."""

    signatures_dir: Path


@dataclass(frozen=True)
class PrebuiltReady(StepResult):
    """unpack_prebuilt, link_precompiled (COS): the signed modules, placed by place_prebuilt."""

    prebuilt_dir: Path


@dataclass(frozen=True)
class GpusChecked(StepResult):
    """check_gpu_compatibility: the module type chosen; ``no_gpu``, on a --dry-run without
    an NVIDIA GPU: what the real run here would end in (the plan is still printed)."""

    module_type: str
    no_gpu: str | None = None


@dataclass(frozen=True)
class Verified(StepResult):
    """verify: the GPUs nvidia-smi saw and each readiness check's result by its key."""

    gpus: tuple[Gpu, ...]
    checks: Mapping[str, str]


@dataclass(frozen=True)
class BundleStaged(StepResult):
    """fetch_prebuilt_bundle: the staged tree came from this bundle."""

    manifest: Manifest


@dataclass(frozen=True)
class NextBootTaken(StepResult):
    """take_next_boot: the staged tree is the one kept for this boot."""


@dataclass(frozen=True)
class KeptForNextBoot(StepResult):
    """stage_next_boot: the build kept aside, the running driver (in use) untouched."""

    in_use: InUse


@dataclass(frozen=True)
class ModuleArgsWaiting(StepResult):
    """apply_module_args: what holds the loaded driver, so NVIDIA_MODULE_ARGS wait for
    its next load."""

    holders: str


@dataclass(frozen=True)
class PersistenceModeSet(StepResult):
    """persistence_mode: whether nvidia-smi -pm 1 worked."""

    state: Literal["on", "failed"]


@dataclass(frozen=True)
class BundleWritten(StepResult):
    """write_bundle (bundle build)."""

    written: Written


R = TypeVar("R", bound=StepResult)


@dataclass(frozen=True)
class Collected:
    step: str
    result: StepResult


class Results:
    """The results of the steps run so far, in plan order; appended by the executor only
    (plan.run_step)."""

    def __init__(self) -> None:
        self._entries: list[Collected] = []

    def add(self, step: str, result: StepResult) -> None:
        self._entries.append(Collected(step, result))

    @property
    def entries(self) -> tuple[Collected, ...]:
        return tuple(self._entries)

    def get(self, kind: type[R]) -> R | None:
        """The latest result of ``kind`` (None: no step returned one)."""
        for entry in reversed(self._entries):
            if isinstance(entry.result, kind):
                return entry.result
        return None

    def need(self, kind: type[R]) -> R:
        """The latest result of ``kind``, which the plan makes before the step asking."""
        found = self.get(kind)
        if found is None:
            raise LookupError(f"no step before this one returned {kind.__name__}: "
                              "the plan is out of order")
        return found

    def staging(self) -> Tree:
        """The staging tree prepare_staging made."""
        return self.need(Staged).tree

    def download(self, artifact: Artifact) -> Downloaded | None:
        """Where ``artifact`` was downloaded to (None: not fetched in this run)."""
        for entry in reversed(self._entries):
            if isinstance(entry.result, Fetched) and artifact in entry.result.files:
                return entry.result.files[artifact]
        return None
