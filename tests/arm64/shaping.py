"""The installer's files that decide what ``bundle build --arch arm64`` produces.

The tier's two cross builds (tests/arm64/bundle_cross.py) take 5-20 min each here, and
are cached by content: their key holds these files, not the whole installer/, so a change
elsewhere reuses the cached bundles. What the cached result is: the bundle (the staged
tree's ``drivers/*.ko``, ``bin/``, ``lib64/``, ``firmware/``, its manifest) and the CLI's
JSON summary of it. The files that decide them:

- the ``bundle build`` command's plan (installer/commands/bundle_build.py ``plan``) and
  what it reaches (``STEP_FUNCTIONS``: the steps' other functions in the same files are
  not followed): the headers step, the .run's extraction and the Kbuild argv
  (installer/steps/staging.py), the bundle's manifest and writing;
- the .run's handling and the build jail (installer/driver/, installer/jail/: every
  process of NVIDIA's runs in the jail; the jail is started by ``-m``);
- ``uname -m`` (installer/kmod/kernel.py ``machine``, reached through ``ctx.kernel`` in
  ``cross_target``): it decides that the build is a cross build;
- everything those import (tests/unit/test_shaping_arm64.py checks the list is closed).

Not in the key: the command's plumbing (installer/commands/bundle_cli.py, the settings,
detection, ``plan.execute``), which carries the tier's argv into the plan and runs it,
and runs on every default-tier run (tests/integration/test_bundle.py's ``bundle build``
of fixture .run files); the download (``NOT_FOLLOWED``: the .run's bytes are in the key
themselves); the signing steps (the tier signs nothing).
"""

from __future__ import annotations

from pathlib import Path

from tests.shapingcheck import Shaping

REPO = Path(__file__).resolve().parents[2]

# Where the build starts: the command's function that plans it.
ENTRY = ("installer/commands/bundle_cli.py", "build_command")
# A directory stands for every .py under it.
SHAPING = (
    "installer/__init__.py",  # __version__, written into the manifest
    "installer/commands/bundle_build.py",
    "installer/distros/headers_build_flow.py",
    "installer/steps/staging.py",
    "installer/driver",
    "installer/jail",
    "installer/records/bundle_manifest.py",
    "installer/bundle/tree.py",
    "installer/host/gpus.py",
    "installer/host/hostroot.py",
    "installer/host/installdir.py",
    "installer/host/runner.py",
    "installer/kmod/headers.py",
    "installer/kmod/kernel.py",  # ctx.kernel.machine(): cross or not (cross_target)
    "installer/kmod/modinfo.py",
    "installer/net/policy.py",
    "installer/base/branches.py",
    "installer/base/cpuarch.py",
    "installer/base/dataclass.py",
    "installer/base/errors.py",
    "installer/base/fsutil.py",
    "installer/base/kinds.py",
    "installer/base/podcontract.py",
    "installer/base/safejson.py",
    "installer/base/signals.py",
    "installer/base/values.py",
)
# Files of more than the build: only these functions are followed (name by name:
# tests/unit/test_shaping_arm64.py), each reached from ENTRY (methods reached through an
# object, ``distro.headers_step()``, named as Class.method).
STEP_FUNCTIONS = {
    "installer/commands/bundle_build.py": (
        "plan", "cross_target", "write_bundle", "_run_sha256", "compiler_version",
        "make_manifest", "write"),
    "installer/distros/headers_build_flow.py": (
        "compile_steps", "find_kernel_headers", "HeadersBuildFlow.headers_step",
        "HeadersBuildFlow.driver_version", "HeadersBuildFlow.module_type"),
    "installer/steps/staging.py": (
        "prepare_staging", "extract_driver", "build_driver", "_make_argv"),
}
# Reached from ENTRY, but not the tier's build: why for each.
NOT_FOLLOWED = {
    ("installer/commands/bundle_build.py", "sign_modules"): "the tier passes no --signing-key",
    ("installer/commands/bundle_build.py", "_signed"): "sign_modules' check",
    ("installer/steps/staging.py", "download_driver"): "fetches the .run, whose bytes are "
    "in the key (bundle_cross.bundle_build)",
}
# Names those functions use that carry values between steps and decide nothing of the
# build: the plan and its Step, the results, the Context, the logger; ``for_host`` picks
# the flow, and ``plan`` refuses any but HeadersBuildFlow, whose methods are followed.
DATA_ONLY = frozenset({
    "Step", "Plan", "Context", "Staged", "Fetched", "Extracted", "HeadersReady",
    "ToolchainReady", "BundleWritten", "structlog", "for_host",
})

BUILD = Shaping(SHAPING, STEP_FUNCTIONS, DATA_ONLY)  # what tests/shapingcheck.py checks


def files(root: Path = REPO) -> list[Path]:
    """Every file SHAPING names, relative to ``root``, sorted."""
    return BUILD.files(root)


def source_hash(root: Path = REPO) -> str:
    """The installer's part in the bundles' key: each shaping file's path and content."""
    return BUILD.source_hash("arm64-shaping", root)
