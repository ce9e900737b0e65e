"""installer.base.lazyimport: structlog's asyncio import deferred until asyncio is used.
Each case runs in a fresh interpreter (the deferral changes sys.modules process-wide)."""

from __future__ import annotations

from tests.freshpython import stdout_of as _python


def test_structlog_imports_without_loading_asyncio_once_deferred():
    out = _python(
        "import sys\n"
        "from installer.base.lazyimport import defer_unused, is_deferred\n"
        "defer_unused()\n"
        "import structlog\n"
        "structlog.get_logger('x').info('event', k=1)\n"
        "print(sorted(m for m in sys.modules if m.startswith('asyncio.')), is_deferred('asyncio'))\n")
    assert out.endswith("[] True")


def test_without_the_deferral_structlog_loads_asyncio():
    """The control: what the deferral saves is real (structlog's package imports asyncio)."""
    out = _python("import sys, structlog\nprint('asyncio.base_events' in sys.modules)")
    assert out == "True"


def test_a_deferred_module_works_when_used():
    out = _python(
        "from installer.base.lazyimport import defer, is_deferred\n"
        "defer('asyncio')\n"
        "import asyncio.subprocess\n"  # a submodule first: its parent loads for it
        "import asyncio\n"
        "from asyncio import Queue\n"
        "async def answer():\n"
        "    return 42\n"
        "print(asyncio.run(answer()), Queue.__module__, is_deferred('asyncio'))\n")
    assert out == "42 asyncio.queues False"


def test_defer_leaves_imported_and_missing_modules_alone():
    out = _python(
        "import sys, json\n"
        "from installer.base.lazyimport import defer, is_deferred\n"
        "defer('json'); defer('no_such_module_here')\n"
        "print(is_deferred('json'), 'no_such_module_here' in sys.modules)\n")
    assert out == "False False"
