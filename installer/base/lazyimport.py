"""Libraries that a dependency imports at its top but a run never uses, loaded on first
use instead.

structlog's package imports ``structlog.stdlib`` and ``structlog._native``, which import
asyncio at their top for their async logging methods only (``await
asyncio.get_running_loop()...``); nothing here logs asynchronously. asyncio, with ssl and
its event loop modules, is the largest part of structlog's import (docs/performance.md),
paid on every start. Deferred, ``import asyncio`` binds a stand-in module that imports the
real one the first time any of its attributes is read, so code that does use it sees no
difference; only an attribute set on the stand-in itself (before anything read one) stays
on the stand-in, which is why only modules no run uses are deferred. (The standard
library's ``importlib.util.LazyLoader`` cannot do this here: the ``import`` statement
itself reads the module's ``__spec__``, which makes it load.)
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types

# Imported at the top of a dependency, used by none of our runs (see above).
UNUSED_AT_START = ("asyncio",)


class _Deferred(types.ModuleType):
    """Stands in for a module in ``sys.modules`` until one of its attributes is read."""

    def __getattr__(self, attr: str) -> object:  # only for attributes it does not have
        return getattr(_real(self), attr)


def _real(stand_in: _Deferred) -> types.ModuleType:
    name = stand_in.__name__
    if sys.modules.get(name) is stand_in:
        del sys.modules[name]  # the import below loads the real module in its place
    return sys.modules.get(name) or importlib.import_module(name)


def defer(name: str) -> None:
    """Make ``import name`` (a top-level module) cheap until the module is used; nothing
    when it is already imported or cannot be found (the import then fails where it is
    made, as before)."""
    # importlib.machinery is loaded with the interpreter; importlib.util costs ~2 ms more.
    if name in sys.modules or importlib.machinery.PathFinder.find_spec(name) is None:
        return
    sys.modules[name] = _Deferred(name)


def is_deferred(name: str) -> bool:
    """True while ``name`` is still the stand-in (never loaded)."""
    return isinstance(sys.modules.get(name), _Deferred)


def defer_unused() -> None:
    for name in UNUSED_AT_START:
        defer(name)
