"""NVIDIA's data-center driver branches as they stand on POLICY_DATE: a small dated table.

Source: NVIDIA's data center driver lifecycle and release notes (docs.nvidia.com,
"Data Center Driver Lifecycle"), as of POLICY_DATE. Update the table, the date and
RECOMMENDED_VERSION together; `doctor` prints the date so an old table shows.

- R535 (long-term) ended in June 2026; R550, R570 and R575 are past their end of life.
- R580 is the current long-term branch (supported to mid-2028) and the last branch for
  Maxwell, Pascal and Volta GPUs (gpus.py's per-architecture limits).
- R595 is the production branch; R620 is the next long-term branch.
- From R615 NVIDIA ships only the open kernel modules (no proprietary ones to build).

Nothing here refuses a version because its branch ended: a node keeps the driver its
operator pinned, with a warning (``branch_warning``) naming the branch to move to.
"""

from __future__ import annotations

from installer.base.dataclass import dataclass

POLICY_DATE = "2026-11-26"


@dataclass(frozen=True)
class Branch:
    number: int
    kind: str  # "long-term" (LTSB), "production", "feature"
    supported: bool  # False: past its end of life on POLICY_DATE
    until: str  # end of life, as NVIDIA states it
    note: str = ""


BRANCHES: tuple[Branch, ...] = (
    Branch(470, "long-term", False, "2024", "the last branch for Kepler (K80)"),
    Branch(535, "long-term", False, "June 2026"),
    Branch(550, "production", False, "ended"),
    Branch(570, "production", False, "ended"),
    Branch(575, "feature", False, "ended"),
    Branch(580, "long-term", True, "mid-2028", "the last branch for Maxwell, Pascal, Volta"),
    Branch(595, "production", True, "the next production branch"),
    Branch(620, "long-term", True, "the next long-term branch"),
)
# The Ubuntu default: a release of the current long-term branch (R580).
RECOMMENDED_VERSION = "580.82.07"
# What messages offer as an example: a release of the current long-term branch and that
# branch (never a literal that the table may since have ended; tests/unit/test_branches.py).
EXAMPLE_VERSION = RECOMMENDED_VERSION
EXAMPLE_BRANCH = f"R{RECOMMENDED_VERSION.split('.', 1)[0]}"
# From this branch on, NVIDIA's .run carries no proprietary kernel modules.
OPEN_ONLY_SINCE = 615


def branch_of(version: str) -> int | None:
    """``550.54.14`` -> 550; None for aliases such as ``default`` or ``R535``."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def branch(version: str) -> Branch | None:
    """``version``'s branch in the table (None: an alias, or a branch it does not list)."""
    number = branch_of(version)
    return next((b for b in BRANCHES if b.number == number), None)


def branch_warning(version: str) -> str | None:
    """A one-line warning when ``version``'s branch is past its end of life (None when it
    is supported or not in the table)."""
    known = branch(version)
    if known is None or known.supported:
        return None
    recommended = RECOMMENDED_VERSION.split(".", 1)[0]
    return (f"driver {version} is from R{known.number}, a {known.kind} branch past its end of "
            f"life ({known.until}; NVIDIA's lifecycle as of {POLICY_DATE}): it gets no "
            f"security fixes; move to R{recommended} (e.g. {RECOMMENDED_VERSION}), the current "
            "long-term branch, where the GPUs allow")


def describe() -> str:
    """What `doctor` prints: the table's date and its supported branches."""
    current = ", ".join(f"R{b.number} ({b.kind})" for b in BRANCHES if b.supported)
    return f"driver branch policy of {POLICY_DATE}: supported {current}"
