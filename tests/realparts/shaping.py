"""The installer's files that decide what a build through the installer produces.

NVIDIA's real builds through the installer (tests/realparts/through_installer.py: 535, 470,
550 open and proprietary for the qemu tier, 535 open for tests/realparts) take minutes
each, and CI keeps their results between runs. Their cache key holds these files, not the
whole installer/: a change elsewhere reuses the cached builds. What the cached result is:
the install dir (``drivers/*.ko``, ``bin/``, ``lib64/``, ``firmware/``, ``.cache``, the
two logs) and the events the tests read (``kernel_modules_build_started``,
``nvidia_installer_started``, ``install_failed``). The files that decide them:

- the .run's extraction, the build jail, NVIDIA's Makefile's argv and nvidia-installer's
  (installer/driver/, installer/jail/: every process of NVIDIA's runs in the jail);
- the two steps that drive them (``STEP_FUNCTIONS``: their other steps, in the same
  files, are not followed);
- where the results land (host/installdir.py, ``promote``), the ``.cache`` record the
  guest's cache-hit run reads back (records/cache.py, ``record_cache``), the failure event
  (exits.py);
- everything those import (tests/unit/test_shaping_realparts.py checks the list is closed).

The rest of the install (detection, planning, loading, verification, the daemons) runs on
every CI run anyway: the default tier's pod installs of fixture .run files, and the guests,
which run this tree's installer on every boot over the cached install dirs.
"""

from __future__ import annotations

from pathlib import Path

from tests.shapingcheck import Shaping

REPO = Path(__file__).resolve().parents[2]

# A directory stands for every .py under it.
SHAPING = (
    "installer/__init__.py",  # __version__, written into .cache (CACHE_WRITTEN_BY)
    "installer/driver/module_build.py",
    "installer/driver/nvidia_options.py",
    "installer/driver/nvidia_run.py",
    "installer/driver/nvidia_urls.py",
    "installer/jail",
    "installer/host/hostroot.py",
    "installer/host/installdir.py",
    "installer/host/osinfo.py",
    "installer/host/runner.py",
    "installer/kmod/headers.py",
    "installer/records/cache.py",
    "installer/records/cachekey.py",
    "installer/base/branches.py",
    "installer/base/cpuarch.py",
    "installer/base/dataclass.py",
    "installer/base/errors.py",
    "installer/base/fsutil.py",
    "installer/base/kinds.py",
    "installer/base/podcontract.py",
    "installer/base/signals.py",
    "installer/base/values.py",
    "installer/exits.py",
    "installer/log.py",
    "installer/net/policy.py",
    "installer/steps/staging.py",
    "installer/steps/activate.py",
)
# Files of many steps: only these functions are the build's (their imports are checked
# name by name: test_shaping.py); the files' other steps are not followed.
STEP_FUNCTIONS = {
    "installer/steps/staging.py": ("extract_driver", "build_driver"),
    "installer/steps/activate.py": ("promote", "record_cache"),
}
# Names those functions use that carry values between steps and decide nothing of the
# build: the plan's Step, the results and journal records, the Context, the logger.
DATA_ONLY = frozenset({
    "Step", "Context", "Staged", "Fetched", "Extracted", "HeadersReady", "ToolchainReady",
    "BundleStaged", "InstallPromoted", "InstallCommitted", "structlog",
})


BUILD = Shaping(SHAPING, STEP_FUNCTIONS, DATA_ONLY)  # what tests/shapingcheck.py checks


def files(root: Path = REPO) -> list[Path]:
    """Every file SHAPING names, relative to ``root``, sorted."""
    return BUILD.files(root)


def source_hash(root: Path = REPO) -> str:
    """The key of the installer's part in a build: each shaping file's path and content."""
    return BUILD.source_hash("shaping", root)
