"""Settings: everything the CLI and env vars decide, frozen, validated once."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from installer import podcontract
from installer.envvars import ENV_RETRIES, ENV_TIMEOUT
from installer.errors import UsageError
from installer.moduleargs import ModuleArg
from installer.net.integrity import normalize_sha256
from installer.nvidia_urls import NVIDIA_BASE_URL, named_version, run_url
from installer.values import KERNEL_RELEASE_MAX, is_kernel_release

# NVIDIA's download host; --driver-branch picks the path under it.
# Read from the environment only (DESIGN.md section 3, no option): every download's
# retry policy (net/retry.py), which reaches net/ through the Context's session.
DEFAULT_COS_ARTIFACTS_URL = "https://storage.googleapis.com/cos-tools/{build_id}"


@dataclass(frozen=True)
class Settings:
    host_root: Path = podcontract.HOST_ROOT
    install_dir_host: PurePosixPath = podcontract.INSTALL_DIR_HOST
    install_dir: Path | None = None  # this process's view; None: derived (see resolve)
    driver_version: str | None = None  # None: the distro's default
    driver_url: str | None = None
    driver_base_url: str | None = None  # None: the distro's default (Settings.driver_run_url)
    driver_branch: str = "tesla"  # the path segment under NVIDIA's download host
    driver_sha256: str | None = None
    cos_artifacts_url: str = DEFAULT_COS_ARTIFACTS_URL
    kernel_release: str | None = None
    kernel_source_path: Path | None = None
    force: bool = False
    lock_timeout_s: float = 0.0
    dry_run: bool = False
    allow_insecure_http: bool = False
    preload: bool = False
    # Put the driver in the install dir and stop: nothing loaded, unloaded or verified (for
    # DaemonSets that load the modules themselves: cos-gpu-installer v2's -no-verify).
    install_only: bool = False
    # A different driver loaded and in use: "fail" (exit 8 naming the holders, DESIGN §4)
    # or "stage" (build and check the new one, keep it for the next boot: nextboot.py).
    when_in_use: str = "fail"
    toolchain_dir: Path | None = None  # COS tools cache; None: /build/cos-tools or the host's
    toolchain_dir_host: PurePosixPath = PurePosixPath("/var/lib/cos-tools")
    vulkan_icd_dir: Path | None = None  # this process's view; None: via the host root
    vulkan_icd_dir_host: PurePosixPath | None = None  # None: no Vulkan ICD file written
    module_args: tuple[ModuleArg, ...] = ()  # checked when parsed (cli.ModuleArgType)
    persistence_mode: bool = False
    # Also load nvidia-modeset and nvidia-drm (display); by default nvidia and nvidia-uvm only.
    display_modules: bool = False
    kernel_module_type: str = "auto"  # auto | open | proprietary
    metrics_file: PurePosixPath | None = None  # host path of a node_exporter textfile
    cos_artifacts_sha256: str | None = None  # COS manifest (file or URL): pins every artifact
    download_deadline_s: float = 3600.0  # one download, all attempts (retry.TransferLimits)
    download_min_rate: float = 10240.0  # bytes/s over each rate window; 0: no floor
    download_min_rate_time_s: float = 60.0
    download_retries: int | None = None  # attempts per operation; None: the default (retry.py)
    download_timeout_s: float | None = None  # no new attempt after this; None: the default
    # Issue 15: install a prebuilt bundle (URL template) before compiling.
    prebuilt_url: str | None = None
    prebuilt_sha256: str | None = None
    prebuilt_only: bool = False

    def resolved(self) -> Settings:
        """Fill in derived defaults and check combinations (UsageError on bad input)."""
        if not self.install_dir_host.is_absolute() or ".." in self.install_dir_host.parts:
            raise UsageError(
                f"--install-dir-host must be an absolute host path without '..', got "
                f"{str(self.install_dir_host)!r}"
            )
        release = self.kernel_release
        if release is not None and not is_kernel_release(release):
            raise UsageError(
                f"--kernel-release {release!r} is not a kernel release",
                hint="give the node's `uname -r`, e.g. 5.15.0-1049-gke (letters, digits and "
                f". - _ + ~, at most {KERNEL_RELEASE_MAX} characters)",
            )
        install_dir = self.install_dir
        if install_dir is None and podcontract.INSTALL_DIR_CONTAINER.is_dir():
            install_dir = podcontract.INSTALL_DIR_CONTAINER
        elif install_dir is None:
            from installer.hostroot import HostRoot  # CLI start-up time: secrets, hmac

            # Resolved on the host (kubectl debug: a symlinked /home must not send us into
            # this container's own /home).
            install_dir = HostRoot(self.host_root).resolve(self.install_dir_host)
        if install_dir.exists() and not install_dir.is_dir():
            named = "--install-dir" if self.install_dir else "<host-root>/<install-dir-host>"
            raise UsageError(f"{named} {install_dir} is not a directory",
                             hint="name the driver's install dir (NVIDIA_INSTALL_DIR_CONTAINER / "
                             "NVIDIA_INSTALL_DIR_HOST), not a file in it")
        sha = normalize_sha256(self.driver_sha256 or None, "--driver-sha256")
        if self.lock_timeout_s < 0:
            raise UsageError("--lock-timeout must be >= 0 seconds")
        self._check_driver_url_version()
        if self.driver_url and self.driver_base_url:
            raise UsageError("--driver-url and --driver-base-url both name where the .run comes "
                             "from: give one (a full URL from NVIDIA_DRIVER_DOWNLOAD_URL wins "
                             "over a base URL from NVIDIA_DRIVER_BASE_URL)")
        from installer.nvidia_options import too_old

        if self.driver_version and (why := too_old(self.driver_version)):
            raise UsageError(f"--driver-version: {why}", hint="use R470 or newer")
        if self.kernel_module_type not in ("auto", "open", "proprietary"):
            raise UsageError(
                f"bad --kernel-module-type {self.kernel_module_type!r}",
                hint="use auto, open or proprietary",
            )
        if not re.fullmatch(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*", self.driver_branch) or \
                ".." in self.driver_branch.split("/"):
            raise UsageError(f"bad --driver-branch {self.driver_branch!r}",
                             hint="a path under NVIDIA's download host, e.g. tesla")
        for name, host_path in (("--toolchain-dir-host", self.toolchain_dir_host),
                                ("--vulkan-icd-dir-host", self.vulkan_icd_dir_host)):
            if host_path is not None and (not host_path.is_absolute() or ".." in host_path.parts):
                raise UsageError(f"{name} must be an absolute host path without '..', got "
                                 f"{str(host_path)!r}")
        if self.metrics_file is not None and not PurePosixPath(self.metrics_file).is_absolute():
            raise UsageError(
                f"--metrics-file must be an absolute host path, got {str(self.metrics_file)!r}",
                hint="e.g. /var/lib/node_exporter/textfile_collector/nvidia_driver.prom",
            )
        if not (self.download_deadline_s > 0 and self.download_min_rate >= 0
                and self.download_min_rate_time_s > 0):
            raise UsageError("--download-deadline and --download-min-rate-time must be > 0 "
                             "seconds, --download-min-rate >= 0 bytes/s")
        if self.install_only and (self.preload or self.persistence_mode):
            raise UsageError("--install-only loads nothing: it cannot be combined with "
                             f"{'--preload' if self.preload else '--persistence-mode'}")
        prebuilt_sha = check_prebuilt(self.prebuilt_url, self.prebuilt_sha256,
                                      self.prebuilt_only,
                                      allow_insecure_http=self.allow_insecure_http)
        return replace(self, install_dir=install_dir, driver_sha256=sha,
                       prebuilt_sha256=prebuilt_sha)

    def driver_run_url(self, version: str, default_base: str | None = None) -> str:
        """--driver-url as given, else <base>/<V>/NVIDIA-Linux-x86_64-<V>.run; the base is
        --driver-base-url, else the distro's ``default_base``, else NVIDIA's for the branch."""
        if self.driver_url:
            return self.driver_url
        return run_url(self.driver_base_url or default_base
                       or NVIDIA_BASE_URL.format(branch=self.driver_branch), version)

    def _check_driver_url_version(self) -> None:
        """--driver-url's file name and --driver-version naming two drivers: refused now
        (the .run's own version is checked once extracted, before anything is unloaded)."""
        named = named_version(self.driver_url) if self.driver_url else None
        wanted = self.driver_version
        if named and wanted and wanted[:1].isdigit() and named != wanted:
            raise UsageError(f"--driver-url names driver {named} "
                             f"(NVIDIA-Linux-x86_64-{named}.run), --driver-version {wanted}",
                             hint="give the URL of the version you want, or drop "
                             "--driver-version (it is read from the URL's file name)")


def check_prebuilt(url: str | None, sha256: str | None, only: bool, *,
                   allow_insecure_http: bool) -> str | None:
    """The --prebuilt-* options (issue 15), checked together; the sha256 normalised."""
    if url is None:
        if sha256 or only:
            raise UsageError("--prebuilt-sha256 and --prebuilt-only need --prebuilt-url "
                             "(NVIDIA_PREBUILT_URL)")
        return None
    # CLI start-up time: these pull in structlog and urllib.request (~100 ms), needed only
    # with --prebuilt-url.
    from installer.bundle.manifest import BundleError, check_template
    from installer.net.policy import check_url_scheme

    try:
        check_template(url)
    except BundleError as exc:
        raise UsageError(str(exc), hint="e.g. https://bundles.example.com/nvidia/ or "
                         "file:///mnt/bundles/nvidia-driver-{driver_version}-{module_type}-"
                         "{kernel_release}.tar.zst") from None
    check_url_scheme(url, allow_insecure_http=allow_insecure_http)
    return normalize_sha256(sha256 or None, "--prebuilt-sha256")


def default_when_in_use(environ: Mapping[str, str]) -> str:
    """--when-in-use when neither the flag nor WHEN_IN_USE is given: ``stage`` in a pod (the
    kubelet sets KUBERNETES_SERVICE_HOST in every container), so GKE's own DaemonSets, which
    set no WHEN_IN_USE, keep the pod running instead of crash-looping on exit 8; ``fail`` by
    hand, where exit 8 naming the holders is the answer a person at the node wants."""
    return "stage" if environ.get("KUBERNETES_SERVICE_HOST") else "fail"


def retry_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """Settings fields from ``DOWNLOAD_RETRIES`` / ``DOWNLOAD_TIMEOUT`` (UsageError naming
    the variable when a value is not valid)."""
    fields: dict[str, Any] = {}
    raw = environ.get(ENV_RETRIES, "").strip()
    if raw:
        try:
            attempts = int(raw)
        except ValueError:
            attempts = 0
        if attempts < 1:
            raise UsageError(
                f"{ENV_RETRIES}={raw!r} is not a valid number of attempts",
                hint="set it to an integer >= 1 (1 means no retry)",
            )
        fields["download_retries"] = attempts
    raw = environ.get(ENV_TIMEOUT, "").strip()
    if raw:
        try:
            total = float(raw)
        except ValueError:
            total = -1.0
        if not total > 0 or total == float("inf"):
            raise UsageError(
                f"{ENV_TIMEOUT}={raw!r} is not a valid total timeout",
                hint="set it to a number of seconds > 0",
            )
        fields["download_timeout_s"] = total
    return fields
