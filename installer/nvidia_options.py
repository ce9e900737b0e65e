"""The nvidia-installer command line, built for the exact release it is passed to.

nvidia-installer refuses any option its own release does not know
(``nvgetopt``: ``unrecognized option``, then ``Invalid commandline`` and exit 1),
so every option newer than our oldest supported release is gated on the first
release whose ``option_table.h`` has it (NVIDIA/nvidia-installer, read at its
release tags; see tests/fixtures/nvidia_installer_options.json).
"""

from __future__ import annotations

from pathlib import Path

from installer.errors import UsageError

# First release tag whose option table has each option; every other option we
# pass exists in every release we support (R470 and newer).
FIRST_RELEASE = {
    "--no-systemd": "465.19.01",
    "--kernel-module-build-directory": "470.42.01",
    "--no-kernel-modules": "515.43.04",
    "--skip-module-load": "550.40.07",
    "--kernel-module-type": "555.42.02",
}
OLDEST_SUPPORTED = "465.19.01"
LOG_FILE = "/var/log/nvidia-installer.log"


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def accepts(version: str, option: str) -> bool:
    """Whether nvidia-installer ``version`` knows ``option`` (``--name``, no value)."""
    first = FIRST_RELEASE.get(option)
    return first is None or version_key(version) >= version_key(first)


def module_type_args(version: str, module_type: str) -> list[str]:
    """Select proprietary or open modules in the spelling this release knows.

    ``--kernel-module-type`` from 555.42.02; before it, 470.42.01+ take
    ``--kernel-module-build-directory=kernel-open`` (proprietary is the default).
    """
    if accepts(version, "--kernel-module-type"):
        return [f"--kernel-module-type={module_type}"]
    if module_type == "proprietary":
        return []
    if accepts(version, "--kernel-module-build-directory") and version_key(version) >= (515,):
        return ["--kernel-module-build-directory=kernel-open"]
    raise UsageError(
        f"driver {version} has no open kernel modules (they exist from R515)",
        hint="use --kernel-module-type proprietary, or a newer driver",
        driver_version=version,
    )


def installer_args(
    *,
    version: str,
    kernel_release: str,
    kernel_source_path: Path | None,
    kernel_output_path: Path | None,
    concurrency: int,
    module_type: str | None,
) -> list[str]:
    """Silent, non-interactive nvidia-installer argv for ``version``.

    Loading is ours (in order, after checks, rolled back on failure): releases with
    ``--skip-module-load`` get it; older ones test-load through the kmod tools on
    PATH, which the sandbox makes inert (``sandbox.KMOD_SHIMS``).
    """
    if version_key(version) < version_key(OLDEST_SUPPORTED):
        raise UsageError(
            f"driver {version} is older than this installer supports ({OLDEST_SUPPORTED})",
            hint="use R470 or newer",
            driver_version=version,
        )
    args = [
        "./nvidia-installer",
        "--silent",
        "--accept-license",
        "--no-questions",
        "--ui=none",
        "--no-backup",
        "--no-nouveau-check",
        "--no-rpms",
        "--no-check-for-alternate-installs",
        "--no-install-compat32-libs",
        "--no-distro-scripts",
        "--no-systemd",
        "--skip-module-load",
        f"--log-file-name={LOG_FILE}",
        f"--concurrency-level={concurrency}",
        f"--kernel-name={kernel_release}",
        f"--kernel-install-path=/lib/modules/{kernel_release}/video",
    ]
    args = [a for a in args if accepts(version, a.split("=", 1)[0])]
    if kernel_source_path is None:
        # The older spelling: every release has it (--no-kernel-modules from 515.43.04).
        args.append("--no-kernel-module")
    else:
        args.append(f"--kernel-source-path={kernel_source_path}")
        # Debian/Ubuntu split headers: without the output dir nvidia-installer uses the
        # source dir for both and NVIDIA's conftest fails (determine_kernel_output_path).
        if kernel_output_path is not None and kernel_output_path != kernel_source_path:
            args.append(f"--kernel-output-path={kernel_output_path}")
        if module_type:
            args += module_type_args(version, module_type)
    return args
