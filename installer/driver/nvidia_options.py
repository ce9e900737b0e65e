"""The nvidia-installer command line, built for the exact release it is passed to.

nvidia-installer refuses any option its own release does not know
(``nvgetopt``: ``unrecognized option``, then ``Invalid commandline`` and exit 1),
so every option newer than our oldest supported release is gated on the first
release whose ``option_table.h`` has it (NVIDIA/nvidia-installer, read at its
release tags; see tests/fixtures/nvidia_installer_options.json).
"""

from __future__ import annotations

from installer.base.branches import EXAMPLE_BRANCH, EXAMPLE_VERSION
from installer.base.errors import UsageError
from installer.base.values import is_driver_version

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


def too_old(version: str) -> str | None:
    """Why an explicit driver ``version`` is refused: older than the oldest nvidia-installer
    we drive. One rule for ``install`` and ``manifests render``; None for a
    version we take and for what is no version at all (an alias: checked elsewhere)."""
    parts = version.split(".")
    if len(parts) < 2 or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    if version_key(version) >= version_key(OLDEST_SUPPORTED):
        return None
    return f"driver {version} is older than this installer supports ({OLDEST_SUPPORTED})"


def accepts(version: str, option: str) -> bool:
    """Whether nvidia-installer ``version`` knows ``option`` (``--name``, no value)."""
    first = FIRST_RELEASE.get(option)
    return first is None or version_key(version) >= version_key(first)


# Options that make nvidia-installer build, install, load or unload kernel modules:
# none may reach it (module_build.py builds the modules; modules.py loads them).
KERNEL_MODULE_OPTIONS = (
    "--kernel-module-only", "--kernel-modules-only", "--skip-module-load", "--kernel-name",
    "-k", "--kernel-source-path", "--kernel-output-path", "--kernel-install-path",
    "--kernel-module-build-directory", "-m", "--kernel-module-type", "-M", "--dkms",
    "--allow-installation-with-running-driver", "--rebuild-initramfs",
)
NO_KERNEL_MODULE = "--no-kernel-module"  # every release; --no-kernel-modules from 515.43.04


def installer_args(*, version: str) -> list[str]:
    """Silent, non-interactive nvidia-installer argv for ``version``: user space,
    firmware and nvidia-modprobe only.

    ``--no-kernel-module`` (the spelling every release knows) skips, at every release
    tag from 470.256.02 to 570.*: install_kernel_modules (the build and
    ``test_kernel_modules``, which loads each module through ``syscall(SYS_init_module)``),
    ``check_for_unloaded_kernel_module`` (kernel.c: it rmmods a loaded driver), depmod
    (command-list.c) and the final ``load_kernel_module("nvidia-drm")``
    (install-from-cwd.c); firmware and nvidia-modprobe are still installed (manifest.c
    ``get_installable_file_type_list`` gates only KERNEL_MODULE_SRC, DKMS_CONF and
    NVIDIA_MODPROBE, the last on --no-nvidia-modprobe).
    """
    if (why := too_old(version)) is not None:
        raise UsageError(why, hint="use R470 or newer", driver_version=version)
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
        f"--log-file-name={LOG_FILE}",
        NO_KERNEL_MODULE,
    ]
    args = [a for a in args if accepts(version, a.split("=", 1)[0])]
    check_loads_nothing(args)
    return args


def check_loads_nothing(argv: list[str]) -> None:
    """Refuse (a bug: exit 1) an nvidia-installer argv that would let it touch the
    host kernel's modules."""
    names = {a.split("=", 1)[0] for a in argv[1:]}
    bad = sorted(names & set(KERNEL_MODULE_OPTIONS))
    if NO_KERNEL_MODULE not in names or bad:
        raise AssertionError(f"nvidia-installer argv would build or load modules: {argv}")


def check_version(version: str) -> str:
    if not is_driver_version(version):
        raise UsageError(
            f"not a driver version: {version!r}",
            hint=f"use a version such as {EXAMPLE_VERSION} (COS also takes default, latest, "
                 f"{EXAMPLE_BRANCH})",
        )
    if (why := too_old(version)) is not None:  # before anything is downloaded
        raise UsageError(why, hint="use R470 or newer", driver_version=version)
    return version
