"""installer.base.startup: no collection while a command's modules load, what they built
frozen afterwards, and the collector left as it was found. Run in a fresh interpreter:
freezing is process-wide."""

from __future__ import annotations

from tests.freshpython import stdout_of as _python


def test_loading_modules_collects_nothing_then_freezes_and_reenables():
    out = _python(
        "import gc\n"
        "from installer.base import startup\n"
        "runs = []\n"
        "gc.callbacks.append(lambda phase, info: phase == 'start' and runs.append(1))\n"
        "frozen_before = gc.get_freeze_count()\n"
        "with startup.loading_modules():\n"
        "    inside = gc.isenabled()\n"
        "    made = [[i] for i in range(50000)]  # far past the young generation's threshold\n"
        "print(inside, len(runs), gc.isenabled(), gc.get_freeze_count() - frozen_before >= 50000)\n")
    assert out == "False 0 True True"


def test_a_collector_that_was_off_stays_off():
    out = _python(
        "import gc\n"
        "from installer.base import startup\n"
        "gc.disable()\n"
        "with startup.loading_modules():\n"
        "    pass\n"
        "print(gc.isenabled())\n")
    assert out == "False"


def test_the_collector_comes_back_when_the_import_fails():
    out = _python(
        "import gc\n"
        "from installer.base import startup\n"
        "try:\n"
        "    with startup.loading_modules():\n"
        "        import installer.no_such_module  # noqa: F401\n"
        "except ImportError:\n"
        "    pass\n"
        "print(gc.isenabled())\n")
    assert out == "True"
