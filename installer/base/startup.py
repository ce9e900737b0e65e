"""The garbage collector at a command's start and end: idle while the command's modules
load, never walking what they built again, and not walking the heap at shutdown.

Every node runs ``install`` on every boot, and a cache hit spends most of its own time
importing (docs/performance.md). Loading ~90 modules makes ~25k objects that live until the
process exits and almost no garbage, yet the collector runs ~30 young collections over them
meanwhile (~5 ms on the 2-vCPU machine the bench runs on). ``gc.freeze`` moves them to the
permanent generation, so the run's own collections never walk them.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def loading_modules() -> Iterator[None]:
    """Around the import of a command's modules: no collection while they load, and what
    they built frozen once they have (the collector as it was before, after)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def before_exit() -> None:
    """What the run made lives until the process exits: the interpreter's shutdown
    collection need not walk it all once more (~10 ms of every run, docs/performance.md).
    Objects are still freed, and finalized, by their reference counts."""
    gc.freeze()
