"""NVIDIA's kernel modules, built by NVIDIA's own Makefile (pure planners).

We build the modules ourselves and run nvidia-installer for user space only, as
NVIDIA's driver container (gpu-driver-container ``nvidia-driver``: ``make
SYSSRC=...`` in ``kernel``/``kernel-open``, then ``nvidia-installer --silent
--no-kernel-module``) and COS's v2 installer (``installUserLibs``:
``--no-kernel-module``; it links the modules itself) do. Why: nvidia-installer
test-loads every module it builds into the running kernel (kernel.c
``test_kernel_modules`` -> ``do_insmod``: ``syscall(SYS_init_module)``, not the
insmod on PATH) and rmmods a loaded driver first
(``check_for_unloaded_kernel_module``); ``--skip-module-load`` only exists from
550.40.07 and does not stop the unload. With ``--no-kernel-module`` it does
none of that (see docs/nvidia-facts.md, "Who loads modules").

What runs is what nvidia-installer's ``build_kernel_module`` runs (kernel.c
``run_make``: ``cd <dir>; make -k -jN NV_EXCLUDE_KERNEL_MODULES="" SYSSRC=...
SYSOUT=...``), minus ``-k``: the first error stops the build.
"""

from __future__ import annotations

from installer.base.cpuarch import CpuArch
from installer.base.errors import UsageError
from installer.base.kinds import OPEN, PROPRIETARY, ModuleType
from installer.driver.nvidia_options import version_key
from installer.kmod.headers import KernelTree

# kernel/ holds the proprietary modules, kernel-open/ the open ones (from R515).
BUILD_DIRS: dict[ModuleType, str] = {PROPRIETARY: "kernel", OPEN: "kernel-open"}
OPEN_SINCE = (515,)
OPEN_DEFAULT_SINCE = (560,)  # the .run's own default build directory is kernel-open
# Built by NVIDIA's Kbuild into the build dir's top level (kernel.c, the .manifest).
MODULE_FILES = ("nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko", "nvidia-drm.ko",
                "nvidia-peermem.ko")
REQUIRED = "nvidia.ko"


def module_type_for(version: str, module_type: str | None) -> ModuleType:
    """The module type to build: as asked, else the release's own default (open from R560)."""
    if module_type is None:
        return OPEN if version_key(version) >= OPEN_DEFAULT_SINCE else PROPRIETARY
    if module_type == PROPRIETARY:
        return PROPRIETARY
    if module_type != OPEN:
        raise UsageError(f"unknown kernel module type {module_type!r}",
                         hint="use open or proprietary")
    if version_key(version) < OPEN_SINCE:
        raise UsageError(
            f"driver {version} has no open kernel modules (they exist from R515)",
            hint="use --kernel-module-type proprietary, or a newer driver",
            driver_version=version,
        )
    return OPEN


def build_dir(version: str, module_type: str | None) -> str:
    """``kernel`` or ``kernel-open``: the dir of the extracted .run that is built."""
    return BUILD_DIRS[module_type_for(version, module_type)]


def make_argv(tree_dir: str, kernel: KernelTree, jobs: int,
              cross: CpuArch | None = None) -> list[str]:
    """``make -C <tree> SYSSRC=<source> SYSOUT=<output> -jN modules``: NVIDIA's Makefile
    with the split Debian/Ubuntu source and output dirs (without SYSOUT its conftest
    fails: kernel.c ``determine_kernel_output_path``).

    ``cross``: the target architecture when it is not the build machine's (an arm64
    bundle built on amd64): Kbuild's ``ARCH=arm64 CROSS_COMPILE=aarch64-linux-gnu-``.
    NVIDIA's Makefile takes ARCH as given (else ``uname -m``) and passes it to Kbuild;
    CROSS_COMPILE, a command-line variable, reaches Kbuild through MAKEFLAGS."""
    argv = ["make", "-C", tree_dir, f"SYSSRC={kernel.source}", f"SYSOUT={kernel.output}",
            f"-j{jobs}"]
    if cross is not None:
        argv += [f"ARCH={cross.kbuild}", f"CROSS_COMPILE={cross.cross_prefix}"]
    return [*argv, "modules"]
