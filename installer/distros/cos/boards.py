"""COS on each architecture: the board that names it, where its artifacts are, and which
module sources Google publishes for it. Pure.

Google's installer (cos/tools, cos-gpu-installer v2) finds a build's artifacts under
``<bucket>/<BUILD_ID>/<board>/``, the board being /etc/lsb-release's
``CHROMEOS_RELEASE_BOARD`` (src/pkg/cos/artifacts.go ``NewGCSDownloader``: "Use {build
number}/{board} as the default GCS download prefix", ``path.Join(e.BuildNumber(),
e.Board())``; src/pkg/cos/env_reader.go ``Board``). The Arm board is ``lakitu-arm64``
(src/cmd/cos_kernel_devenv/devenv.sh ``main``: ``lakitu-arm64) KERNEL_ARCH=arm64``, then
``TOOLCHAIN_ARCH=aarch64``; every other board is x86; src/pkg/tools/sbomutil/sbomutil.go
``findCOSImageSBOM``: an arm64 image's files lie in ``cos-tools/<build>/lakitu-arm64/``).
The names under that prefix are the same on both boards (artifacts.go ``kernelHeaders``,
``toolchainArchive``, ``toolchainURL``, ``toolchainEnv``; installer.go
``templateGPUDriverFile`` ``gpu_%s_version``, ``prebuiltModuleTemplate``
``nvidia-drivers-%s.tgz``): the prefix carries the architecture.

What that source offers on x86_64 only, so that no aarch64 name is guessed for it:

- the precompiled driver: installer.go ``precompiledDriverTemplate`` is
  ``NVIDIA-Linux-x86_64-%s-custom.run`` (``DownloadDriverInstallerV2``), no other;
- Google's mirror of NVIDIA's .run: installer.go ``installerURLTemplate`` names
  ``NVIDIA-Linux-x86_64-%[2]s.run`` only; on aarch64 the .run comes from NVIDIA's own
  version directory (installer/base/cpuarch.py cites that layout);
- building NVIDIA's modules: devenv.sh ``gpu_build`` exits 1 on any other kernel
  architecture ("GPU driver builds only tested for x86"), and the COS toolchain is driven
  from an x86_64 host (devenv.sh ``set_compilation_env``: ``HOSTCC=x86_64-pc-linux-gnu-clang``
  from the toolchain's bin/); whether ``lakitu-arm64``'s ``toolchain.tar.xz`` runs on an
  arm64 node is not in that source. So an arm64 COS install uses the build's signed
  prebuilt modules (``nvidia-drivers-<V>.tgz``, v2's ``RunDriverInstallerPrebuiltModules``),
  and anything that would compile (or --preload, which caches what a compile needs) is
  refused, exit 3.

The newest cos/tools source read here is the 2023-09-28 cos-gpu-installer v2 release (its
GitHub mirror dims/cos-tools @41b149e); GKE's ``a4x`` DaemonSet
(container-engine-accelerators nvidia-driver-installer/cos/daemonset-preloaded-latest-a4x.yaml
@2dd8fc9b) runs that installer with ``install --version=latest`` on GB200 nodes.
"""

from __future__ import annotations

from installer.base.cpuarch import AARCH64, X86_64, CpuArch
from installer.base.errors import UnsupportedHostError, clip
from installer.distros.cos.options import DEFAULT_ARTIFACTS_URL

ARM_BOARD = "lakitu-arm64"
X86_BOARD = "lakitu"
# v2's prefix, <BUILD_ID>/<board>, in the same public bucket (artifacts.go cosToolsGCS).
BOARD_ARTIFACTS_URL = "https://storage.googleapis.com/cos-tools/{build_id}/{board}"
NOT_ON_ARM = ("Google publishes no way to build NVIDIA's modules on arm64 COS, only its "
              "signed prebuilt ones (docs/arm64.md)")


def arch_of_board(board: str) -> CpuArch:
    """The architecture a COS board is built for (devenv.sh: lakitu-arm64 is arm64,
    every other board x86)."""
    return AARCH64 if board == ARM_BOARD else X86_64


def check_board(arch: CpuArch, board: str | None) -> None:
    """UnsupportedHostError (exit 3) when the node's architecture and its COS board
    disagree: the board's artifacts would be another architecture's. No board: only a
    template with ``{board}`` needs one (artifacts.artifacts_base refuses then)."""
    if board is not None and arch_of_board(board) is not arch:
        raise UnsupportedHostError(
            f"this node is {arch} but its COS board {clip(board)!r} is built for "
            f"{arch_of_board(board)}: its artifacts would not run here",
            hint="check --host-root (/etc/lsb-release, /proc/sys/kernel/arch)",
            path="/etc/lsb-release", board=clip(board), machine=arch.machine)


def artifacts_template(template: str, arch: CpuArch) -> str:
    """The artifacts URL template: on aarch64 the default becomes v2's board prefix
    (the board-less one holds the x86_64 files); an operator's own URL is kept."""
    if arch is AARCH64 and template == DEFAULT_ARTIFACTS_URL:
        return BOARD_ARTIFACTS_URL
    return template


def uses_google_mirror(arch: CpuArch) -> bool:
    """Google's regional mirror of NVIDIA's .run names x86_64 files only."""
    return arch is X86_64


def offers_precompiled(arch: CpuArch) -> bool:
    """Google's precompiled ``-custom.run`` is named for x86_64 only."""
    return arch is X86_64


def offers_compile(arch: CpuArch) -> bool:
    """Building the modules from the build's toolchain: x86_64 only (see above)."""
    return arch is X86_64


def refuse_compile(arch: CpuArch, build_id: str, version: str, prebuilt_url: str,
                   why: str) -> UnsupportedHostError:
    """Exit 3: an arm64 COS install that would have to compile (``why``: what ruled the
    prebuilt modules out)."""
    return UnsupportedHostError(
        f"COS build {build_id} on {arch}: {why}, and {NOT_ON_ARM}",
        hint="pick a --driver-version this build ships prebuilt modules for (default or "
        "latest usually do), with open kernel modules",
        url=prebuilt_url, build_id=build_id, driver_version=version, machine=arch.machine)


def refuse_preload(arch: CpuArch) -> UnsupportedHostError:
    return UnsupportedHostError(
        f"--preload caches the COS toolchain and headers for a compile, and on {arch} "
        f"{NOT_ON_ARM}", hint="drop --preload (PRELOAD) on arm64 COS node pools",
        machine=arch.machine)
