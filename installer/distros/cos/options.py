"""COS's own options: where the build's artifacts come from and are pinned, the toolchain
cache, and --preload. The CLI adds them to ``install`` (Distro.options, from
``cli_options``); Settings holds
them as one of its distro options, so nothing generic names a COS field."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from installer.base import podcontract
from installer.base.dataclass import dataclass
from installer.base.errors import UsageError
from installer.settings import CliOption, DistroOptions, Settings

DEFAULT_ARTIFACTS_URL = "https://storage.googleapis.com/cos-tools/{build_id}"


@dataclass(frozen=True)
class CosOptions(DistroOptions):
    cli_options: ClassVar[tuple[CliOption, ...]] = (
        CliOption("--cos-artifacts-url", "COS_DOWNLOAD_GCS",
                  "COS artifacts of the build; {build_id} and {board} are filled in.",
                  default=DEFAULT_ARTIFACTS_URL),
        CliOption("--preload", "PRELOAD",
                  "COS: only fetch and cache the toolchain and kernel headers (no GPU needed).",
                  kind="flag"),
        CliOption("--toolchain-dir", "COS_TOOLS_DIR_CONTAINER",
                  "COS: where the toolchain and kernel headers are cached [default: "
                  "/build/cos-tools if it exists, else <host-root>/<toolchain-dir-host>].",
                  kind="path"),
        CliOption("--toolchain-dir-host", "COS_TOOLS_DIR_HOST",
                  "COS: the tools cache as the host sees it.", kind="host_path",
                  default=str(podcontract.COS_TOOLS_DIR_HOST)),
        CliOption("--cos-artifacts-sha256", "COS_ARTIFACTS_SHA256",
                  "COS: a sha256sum-style manifest (file path or URL) pinning every file the "
                  "install reads (version aliases, toolchain_env, toolchain_url, toolchain, "
                  "kernel headers, the .run, prebuilt modules, custom .run, signatures); each "
                  "must match, and one it does not list is refused before any download (exit 6)."),
    )
    artifacts_url: str = DEFAULT_ARTIFACTS_URL  # {build_id} and {board} filled in
    artifacts_sha256: str | None = None  # a manifest (file or URL) pinning every artifact
    preload: bool = False  # fetch and cache the toolchain and headers only
    toolchain_dir: Path | None = None  # this process's view; None: the container's, or the host's
    toolchain_dir_host: PurePosixPath = podcontract.COS_TOOLS_DIR_HOST

    @classmethod
    def of(cls, settings: Settings) -> CosOptions:
        return settings.options(cls)

    @classmethod
    def from_cli(cls, opts: dict[str, Any]) -> CosOptions:
        """Its options, taken out of the command's ``opts``."""
        return cls(artifacts_url=opts.pop("cos_artifacts_url"),
                   artifacts_sha256=opts.pop("cos_artifacts_sha256") or None,
                   preload=opts.pop("preload"),
                   toolchain_dir=opts.pop("toolchain_dir"),
                   toolchain_dir_host=opts.pop("toolchain_dir_host"))

    def secrets(self) -> tuple[str | None, ...]:
        return self.artifacts_url, self.artifacts_sha256

    def check(self, settings: Settings) -> None:
        if settings.install_only and self.preload:
            raise UsageError("--install-only loads nothing: it cannot be combined with "
                             "--preload")

    def refused_on(self, title: str) -> UsageError | None:
        if self.preload:
            return UsageError(
                "--preload is for Container-Optimized OS (it warms the COS toolchain cache)",
                hint=f"on {title}, run a normal install; kernel headers come from the node "
                "or apt")
        if self.artifacts_sha256:
            return UsageError(f"--cos-artifacts-sha256 pins COS artifacts; this node runs "
                              f"{title}", hint="pin the .run with --driver-sha256 "
                              "(NVIDIA_DRIVER_SHA256) and drop COS_ARTIFACTS_SHA256")
        return None

    def unpinned(self) -> str | None:
        return None if self.artifacts_sha256 else "the COS artifacts (--cos-artifacts-sha256)"
