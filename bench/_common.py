"""Shared by the bench scripts: statistics, formatting, the result rows run_all collects.

Every bench prints its own figures and, with ``--json-out FILE``, writes the
rows of the summary table (target, measured, baseline, ratio, met) as JSON so
``bench/run_all.py`` can print one table.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MB = 1e6


@dataclass
class Stats:
    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Stats:
        if not values:
            return cls(float("nan"), float("nan"), float("nan"), 0)
        return cls(statistics.median(values), min(values), max(values), len(values))

    def fmt(self, scale: float = 1.0, unit: str = "", width: int = 8, digits: int = 1) -> str:
        return " ".join(f"{v * scale:{width}.{digits}f}" for v in (self.median, self.min, self.max)) + (
            f" {unit}" if unit else "")


@dataclass
class Row:
    """One line of the summary table."""

    target: str  # e.g. "cache-hit overhead <= 150 ms"
    measured: str  # e.g. "97 ms"
    baseline: str  # e.g. "shell script 612 ms"
    ratio: str  # e.g. "1.15x"
    met: bool | None  # None: informational / not measured
    note: str = ""
    data: dict = field(default_factory=dict)


def write_rows(rows: list[Row], json_out: str | os.PathLike | None) -> None:
    if json_out:
        Path(json_out).write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")


def print_rows(rows: list[Row], file=sys.stdout) -> None:
    """The summary table (also what run_all prints)."""
    headers = ("target", "measured", "baseline", "ratio", "met?")
    cells = [(r.target, r.measured, r.baseline, r.ratio,
              "n/a" if r.met is None else ("yes" if r.met else "NO")) for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    print(line, file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)), file=file)
    notes = [(r.target, r.note) for r in rows if r.note]
    for target, note in notes:
        print(f"  * {target}: {note}", file=file)


def quiet_structlog() -> None:
    """Only warnings from the installer's loggers (benches print their own figures)."""
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        logger_factory=lambda *_: structlog.PrintLogger(sys.stderr))
