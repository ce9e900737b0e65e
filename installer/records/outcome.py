"""The outcome of a run: the one schema of status.json, read back by the success message,
the CLI, the metrics and doctor. Pure: status.py writes and reads the file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Final

from installer.base.dataclass import dataclass
from installer.base.kinds import OUTCOME_KINDS, OutcomeKind

OK: Final = "ok"
ERROR: Final = "error"
INTERRUPTED: Final = "interrupted"
UNINSTALLED: Final = "uninstalled"
DRY_RUN: Final = "dry_run"  # never written


def _outcome_kind(text: str | None) -> OutcomeKind:
    """status.json's "outcome" read back: one of the kinds, else "unknown"."""
    return next((k for k in OUTCOME_KINDS if k == text), "unknown")


@dataclass(frozen=True)
class Outcome:
    outcome: OutcomeKind
    exit_code: int = 0
    plan: str | None = None
    # The driver that runs once the run is over (ok), or the one the run was installing
    # (error, interrupted). With a version staged for the next boot: the running one.
    driver_version: str | None = None
    staged_driver_version: str | None = None  # waits in .next-boot for the next boot
    # With a staged version, or NVIDIA_MODULE_ARGS waiting: what holds the running driver.
    in_use_by: str | None = None
    # The NVIDIA_MODULE_ARGS asked for that the in-use driver gets at its next load.
    module_args_waiting: tuple[str, ...] | None = None
    install_only: bool = False
    # ok: what the CUDA check proved ("passed", "skipped", "deferred: MIG mode on GPU X, no
    # instances yet", busy GPUs noted; cuda_check.CudaResult.summary)
    cuda_check: str | None = None
    error_class: str | None = None
    message: str | None = None
    hint: str | None = None
    context: Mapping[str, Any] | None = None  # the error's details
    host: Mapping[str, Any] | None = None
    install_dir_host: str | None = None
    steps: tuple[Mapping[str, Any], ...] | None = None
    gpus: tuple[Mapping[str, Any], ...] | None = None
    duration_s: float | None = None
    external_commands_s: float | None = None
    previous_driver_version: str | None = None  # uninstall: the driver it removed
    changes: Mapping[str, Any] | None = None  # uninstall: what it removed
    installer_version: str | None = None
    finished_at: str | None = None
    dry_run: Mapping[str, Any] | None = None  # --dry-run: the plan document

    @property
    def cuda_deferred(self) -> bool:
        """The CUDA proof waits for MIG instances (docs/node-shapes.md)."""
        return self.outcome == OK and (self.cuda_check or "").startswith("deferred")

    @property
    def staged(self) -> bool:
        return self.outcome == OK and self.staged_driver_version is not None

    def to_status_json(self) -> dict[str, Any]:
        """The status.json object (fields without a value left out)."""
        doc: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name == "install_only" and not value):
                continue
            doc[f.name] = list(value) if isinstance(value, tuple) else value
        return doc

    @classmethod
    def from_status_json(cls, doc: Mapping[str, Any]) -> Outcome:
        """The outcome a status.json object records, whichever installer version wrote it.

        Fields of the wrong type read as absent; an exit code that is not one is a
        ValueError (the file is corrupt). Before the running and the staged version were
        two fields, a staged run wrote the staged one as ``driver_version`` and the running
        one in ``staged_for_next_boot``."""
        code = doc.get("exit_code", 0)
        if type(code) is not int or not 0 <= code <= 255:
            raise ValueError(f"exit_code is {str(code)[:40]!r}")
        driver, staged, because = (_text(doc, "driver_version"),
                                   _text(doc, "staged_driver_version"),
                                   _text(doc, "in_use_by"))
        legacy = doc.get("staged_for_next_boot")
        if isinstance(legacy, Mapping) and staged is None:
            staged, driver = driver, _text(legacy, "running_version")
            because = _text(legacy, "holders")
        return cls(
            outcome=_outcome_kind(_text(doc, "outcome")),
            exit_code=code,
            plan=_text(doc, "plan"),
            driver_version=driver,
            staged_driver_version=staged,
            in_use_by=because,
            module_args_waiting=_strings(doc, "module_args_waiting"),
            install_only=doc.get("install_only") is True,
            cuda_check=_text(doc, "cuda_check"),
            error_class=_text(doc, "error_class"),
            message=_text(doc, "message"),
            hint=_text(doc, "hint"),
            context=_mapping(doc, "context"),
            host=_mapping(doc, "host"),
            install_dir_host=_text(doc, "install_dir_host"),
            steps=_mappings(doc, "steps"),
            gpus=_mappings(doc, "gpus"),
            duration_s=_number(doc, "duration_s"),
            external_commands_s=_number(doc, "external_commands_s"),
            previous_driver_version=_text(doc, "previous_driver_version"),
            changes=_mapping(doc, "changes"),
            installer_version=_text(doc, "installer_version"),
            finished_at=_text(doc, "finished_at"),
        )


def _text(doc: Mapping[str, Any], key: str) -> str | None:
    value = doc.get(key)
    return value if isinstance(value, str) else None


def _number(doc: Mapping[str, Any], key: str) -> float | None:
    value = doc.get(key)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _strings(doc: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    value = doc.get(key)
    if not isinstance(value, list):
        return None
    return tuple(v for v in value if isinstance(v, str))


def _mapping(doc: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    value = doc.get(key)
    return value if isinstance(value, Mapping) else None


def _mappings(doc: Mapping[str, Any], key: str) -> tuple[Mapping[str, Any], ...] | None:
    value = doc.get(key)
    if not isinstance(value, list):
        return None
    return tuple(v for v in value if isinstance(v, Mapping))

