"""Settings: everything the CLI and env vars decide, frozen, validated once."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from installer.errors import UsageError

DEFAULT_HOST_ROOT = Path("/root")
DEFAULT_INSTALL_DIR_HOST = PurePosixPath("/home/kubernetes/bin/nvidia")
DEFAULT_INSTALL_DIR_CONTAINER = Path("/usr/local/nvidia")
DEFAULT_DRIVER_BASE_URL = "https://us.download.nvidia.com/tesla"
DEFAULT_COS_ARTIFACTS_URL = "https://storage.googleapis.com/cos-tools/{build_id}"


@dataclass(frozen=True)
class Settings:
    host_root: Path = DEFAULT_HOST_ROOT
    install_dir_host: PurePosixPath = DEFAULT_INSTALL_DIR_HOST
    install_dir: Path | None = None  # this process's view; None: derived (see resolve)
    driver_version: str | None = None  # None: the distro's default
    driver_url: str | None = None
    driver_base_url: str = DEFAULT_DRIVER_BASE_URL
    driver_sha256: str | None = None
    cos_artifacts_url: str = DEFAULT_COS_ARTIFACTS_URL
    kernel_release: str | None = None
    kernel_source_path: Path | None = None
    force: bool = False
    lock_timeout_s: float = 0.0
    dry_run: bool = False
    allow_insecure_http: bool = False
    preload: bool = False
    toolchain_dir: Path | None = None  # COS tools cache; None: /build/cos-tools or the host's
    module_args: tuple[str, ...] = ()
    persistence_mode: bool = False
    kernel_module_type: str = "auto"  # auto | open | proprietary
    metrics_file: PurePosixPath | None = None  # host path of a node_exporter textfile
    cos_artifacts_sha256: str | None = None  # COS manifest (file or URL): pins every artifact
    download_deadline_s: float = 3600.0  # one download, all attempts (retry.TransferLimits)
    download_min_rate: float = 10240.0  # bytes/s over each rate window; 0: no floor
    download_min_rate_time_s: float = 60.0
    # Issue 15: install a prebuilt bundle (URL template) before compiling.
    prebuilt_url: str | None = None
    prebuilt_sha256: str | None = None
    prebuilt_only: bool = False
    extra: dict[str, str] = field(default_factory=dict)

    def resolved(self) -> Settings:
        """Fill in derived defaults and check combinations (UsageError on bad input)."""
        if not self.install_dir_host.is_absolute() or ".." in self.install_dir_host.parts:
            raise UsageError(
                f"--install-dir-host must be an absolute host path without '..', got "
                f"{str(self.install_dir_host)!r}"
            )
        install_dir = self.install_dir
        if install_dir is None and DEFAULT_INSTALL_DIR_CONTAINER.is_dir():
            install_dir = DEFAULT_INSTALL_DIR_CONTAINER
        elif install_dir is None:
            from installer.hostroot import HostRoot

            # Resolved on the host (kubectl debug: a symlinked /home must not send us into
            # this container's own /home).
            install_dir = HostRoot(self.host_root).resolve(self.install_dir_host)
        sha = self.driver_sha256.lower() if self.driver_sha256 else None
        if sha is not None and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)):
            raise UsageError(
                "--driver-sha256 must be 64 hex digits",
                hint="give the SHA-256 of the NVIDIA .run file, e.g. from sha256sum",
            )
        if self.lock_timeout_s < 0:
            raise UsageError("--lock-timeout must be >= 0 seconds")
        for arg in self.module_args:
            mod, dot, kv = arg.partition(".")
            if not (dot and mod and "=" in kv and kv.index("=") > 0):
                raise UsageError(
                    f"bad --module-arg {arg!r}",
                    hint="use MODULE.PARAM=VALUE, e.g. nvidia.NVreg_EnableGpuFirmware=0",
                )
        if self.kernel_module_type not in ("auto", "open", "proprietary"):
            raise UsageError(
                f"bad --kernel-module-type {self.kernel_module_type!r}",
                hint="use auto, open or proprietary",
            )
        if self.metrics_file is not None and not PurePosixPath(self.metrics_file).is_absolute():
            raise UsageError(
                f"--metrics-file must be an absolute host path, got {str(self.metrics_file)!r}",
                hint="e.g. /var/lib/node_exporter/textfile_collector/nvidia_driver.prom",
            )
        if not (self.download_deadline_s > 0 and self.download_min_rate >= 0
                and self.download_min_rate_time_s > 0):
            raise UsageError("--download-deadline and --download-min-rate-time must be > 0 "
                             "seconds, --download-min-rate >= 0 bytes/s")
        prebuilt_sha = self.prebuilt_sha256
        if self.prebuilt_url or prebuilt_sha or self.prebuilt_only:
            from installer.bundle.fetch import check_settings

            prebuilt_sha = check_settings(self.prebuilt_url, prebuilt_sha, self.prebuilt_only,
                                          allow_insecure_http=self.allow_insecure_http)
        return replace(self, install_dir=install_dir, driver_sha256=sha,
                       prebuilt_sha256=prebuilt_sha)


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "y", "on")
