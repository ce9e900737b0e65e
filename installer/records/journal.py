"""What a run changed on the node, written down as each change is made: the only thing
``rollback.undo`` reads (with the step results) to put the node back.

Each step that changes the node notes an undo fact here *before* it moves on to its next
change, so a step that fails half way (an rmmod after another, a load after two modules
went in) leaves exactly what it did. Facts are frozen and only ever appended; the
questions rollback asks are answered from them.
"""

from __future__ import annotations

import os
from pathlib import Path

from installer.base.dataclass import dataclass
from installer.kmod.moduleargs import ModuleArg
from installer.records import readiness


@dataclass(frozen=True)
class ReadinessCleared:
    """This boot's readiness file as the install found it, just before clearing it."""

    text: str


@dataclass(frozen=True)
class ScratchDir:
    """A dir this run fills outside the staging dir that is worthless if it fails (the COS
    tools dir's downloads): removed with the staging dir."""

    path: Path


@dataclass(frozen=True)
class ModuleUnloaded:
    """One module of the loaded driver, rmmod'ed (unload_other_driver, apply_module_args);
    ``version``: that driver's version (None: unknown)."""

    module: str
    version: str | None


@dataclass(frozen=True)
class FirmwarePathRead:
    """``firmware_class.path`` before gpu_firmware writes it ("": unset; None: this kernel
    has no such parameter)."""

    before: str | None


@dataclass(frozen=True)
class ModuleLoaded:
    """One module this run inserted (load_modules)."""

    module: str


@dataclass(frozen=True)
class DeviceFilesListed:
    """The NVIDIA device files there before device_nodes made any."""

    before: frozenset[str]


@dataclass(frozen=True)
class InstallPromoted:
    """The staged install swapped in; the old one waits in ``.previous`` (promote)."""


@dataclass(frozen=True)
class InstallCommitted:
    """The new install verified and recorded: from here on it stays (record_cache)."""


UndoFact = (ReadinessCleared | ScratchDir | ModuleUnloaded | FirmwarePathRead | ModuleLoaded
            | DeviceFilesListed | InstallPromoted | InstallCommitted)


class Journal:
    """The run's undo facts in the order the changes were made (append-only)."""

    def __init__(self) -> None:
        self._facts: list[UndoFact] = []

    def note(self, fact: UndoFact) -> None:
        self._facts.append(fact)

    @property
    def facts(self) -> tuple[UndoFact, ...]:
        return tuple(self._facts)

    @property
    def scratch(self) -> list[Path]:
        return [f.path for f in self._facts if isinstance(f, ScratchDir)]

    @property
    def committed(self) -> bool:
        return any(isinstance(f, InstallCommitted) for f in self._facts)

    @property
    def promoted(self) -> bool:
        return any(isinstance(f, InstallPromoted) for f in self._facts)

    @property
    def loaded(self) -> list[str]:
        """The modules this run inserted, in load order."""
        return [f.module for f in self._facts if isinstance(f, ModuleLoaded)]

    @property
    def unloaded_version(self) -> str | None:
        """The version of the driver this run took (some of) the modules of out."""
        versions = [f.version for f in self._facts if isinstance(f, ModuleUnloaded)]
        return versions[-1] if versions else None

    @property
    def firmware_path_before(self) -> str | None:
        """The first ``firmware_class.path`` read that found the parameter: the second
        gpu_firmware of a plan reads the value the first one wrote."""
        return next((f.before for f in self._facts
                     if isinstance(f, FirmwarePathRead) and f.before is not None), None)

    @property
    def device_files_before(self) -> frozenset[str] | None:
        return next((f.before for f in self._facts if isinstance(f, DeviceFilesListed)), None)

    @property
    def readiness_before(self) -> str | None:
        """This boot's readiness file as the run found it (None: there was none)."""
        return next((f.text for f in self._facts if isinstance(f, ReadinessCleared)), None)

    @property
    def module_args_loaded(self) -> tuple[ModuleArg, ...] | None:
        """The NVIDIA_MODULE_ARGS the loaded driver was loaded with, per this boot's
        readiness file (None: unknown, e.g. loaded by someone else). What the kernel runs
        with is modules.loaded_params; this says which of those were asked for:
        apply_module_args (an argument dropped since) and the rollback read it."""
        text = self.readiness_before
        return None if text is None else readiness.loaded_module_args(readiness.parse(text))


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
