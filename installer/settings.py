"""Settings: everything the CLI and env vars decide, frozen, validated once."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Literal, TypeVar

from installer.base import podcontract
from installer.base.dataclass import dataclass
from installer.base.envvars import ENV_RETRIES, ENV_TIMEOUT
from installer.base.errors import UsageError
from installer.base.kinds import AUTO, MODULE_TYPE_REQUESTS, DaemonName, ModuleTypeRequest
from installer.base.values import KERNEL_RELEASE_MAX, is_kernel_release
from installer.driver.nvidia_options import too_old
from installer.driver.nvidia_urls import (
    FABRIC_MANAGER_BASE_URL,
    NVIDIA_BASE_URL,
    named_version,
    run_url,
)
from installer.host import gpus
from installer.kmod.moduleargs import ModuleArg
from installer.net.integrity import normalize_sha256


@dataclass(frozen=True)
class CliOption:
    """One option a distro adds to ``install``, in words: the command layer (cli.py) makes
    the click option from it, so no distro and nothing below the CLI imports click."""

    flag: str  # "--cos-artifacts-url"
    envvar: str
    help: str
    # text: a string; flag: a boolean switch; path: this process's path; host_path: a
    # path as the host sees it (absolute, no '..': commands/click_types.HostPath)
    kind: Literal["text", "flag", "path", "host_path"] = "text"
    default: str | None = None  # shown in --help when given

    @property
    def dest(self) -> str:
        """The key the command's parsed options hold it under."""
        return self.flag.lstrip("-").replace("-", "_")


class DistroOptions(ABC):
    """A distro's own options (e.g. distros/cos/options.py), held in Settings.distro_options:
    generic code names none of their fields. A subclass is a frozen dataclass whose every
    field has a default (what applies when the CLI did not add its options), declares its
    ``cli_options`` and reads them back in ``from_cli``."""

    cli_options: ClassVar[tuple[CliOption, ...]] = ()

    @classmethod
    def given(cls, opts: Mapping[str, Any]) -> bool:
        """Whether the command has these options (it was given ``cli_options``)."""
        return bool(cls.cli_options) and cls.cli_options[0].dest in opts

    @classmethod
    @abstractmethod
    def from_cli(cls, opts: dict[str, Any]) -> DistroOptions:
        """The options, taken (popped) out of the command's parsed ``opts``."""

    def check(self, settings: Settings) -> None:
        """Refuse combinations with the other settings (UsageError). Pure."""
        return None

    def refused_on(self, title: str) -> UsageError | None:
        """Why these options cannot be used on another distro's host (titled ``title``)."""
        return None

    def unpinned(self) -> str | None:
        """What the distro downloads besides the .run that these options leave unpinned."""
        return None

    def secrets(self) -> tuple[str | None, ...]:
        """Values that may carry credentials (URLs): never shown."""
        return ()


@dataclass(frozen=True)
class Settings:
    host_root: Path = podcontract.HOST_ROOT
    install_dir_host: PurePosixPath = podcontract.INSTALL_DIR_HOST
    install_dir: Path | None = None  # this process's view; None: installdir.locate finds it
    driver_version: str | None = None  # None: the distro's default
    driver_url: str | None = None
    driver_base_url: str | None = None  # None: the distro's default (Settings.driver_run_url)
    driver_branch: str = "tesla"  # the path segment under NVIDIA's download host
    driver_sha256: str | None = None
    kernel_release: str | None = None
    kernel_source_path: Path | None = None
    force: bool = False
    lock_timeout_s: float = 0.0
    dry_run: bool = False
    # --gpu-model (install --dry-run only): plan as if one GPU of this model were on the
    # PCI bus (gpus.assumed_gpu names what it accepts; detect.probe puts it in the probe).
    dry_run_gpu_model: str | None = None
    allow_insecure_http: bool = False
    # Put the driver in the install dir and stop: nothing loaded, unloaded or verified (for
    # DaemonSets that load the modules themselves: cos-gpu-installer v2's -no-verify).
    install_only: bool = False
    # A different driver loaded and in use: "fail" (exit 8 naming the holders, docs/contract.md §4)
    # or "stage" (build and check the new one, keep it for the next boot: records/staged_driver.py).
    when_in_use: str = "fail"
    vulkan_icd_dir: Path | None = None  # this process's view; None: via the host root
    vulkan_icd_dir_host: PurePosixPath | None = None  # None: no Vulkan ICD file written
    module_args: tuple[ModuleArg, ...] = ()  # checked when parsed (cli.ModuleArgType)
    persistence_mode: bool = False
    # verify also runs CUDA (a context and a memory round trip on each GPU, in a
    # child under this deadline); skipped only by choice, where no context may be made.
    skip_cuda_check: bool = False
    cc_set_ready: bool = False  # --cc-set-ready: nvidia-smi conf-compute -srs 1 before CUDA
    cuda_check_deadline_s: float = 60.0
    # NVSwitch nodes (docs/node-shapes.md): the fabric manager of the installed version (fabricmanager.py)
    # and how long the NVLink fabric may take to reach Completed.
    fabric_manager_base_url: str = FABRIC_MANAGER_BASE_URL
    fabric_manager_sha256: str | None = None
    fabric_deadline_s: float = 600.0
    # The daemon sidecars the DaemonSet runs (kinds.DaemonName, a click.Choice): ready only
    # with each up.
    required_daemons: tuple[DaemonName, ...] = ()
    # Also load nvidia-modeset and nvidia-drm (display); by default nvidia and nvidia-uvm only.
    display_modules: bool = False
    kernel_module_type: ModuleTypeRequest = AUTO
    metrics_file: PurePosixPath | None = None  # host path of a node_exporter textfile
    download_deadline_s: float = 3600.0  # one download, all attempts (retry.TransferLimits)
    download_min_rate: float = 10240.0  # bytes/s over each rate window; 0: no floor
    download_min_rate_time_s: float = 60.0
    download_retries: int | None = None  # attempts per operation; None: the default (retry.py)
    download_timeout_s: float | None = None  # no new attempt after this; None: the default
    # A prebuilt bundle (docs/contract.md §3): install it (URL template) before compiling.
    prebuilt_url: str | None = None
    prebuilt_sha256: str | None = None
    prebuilt_only: bool = False
    # Each distro's own options (Distro.options), one object per distro that has some.
    distro_options: tuple[DistroOptions, ...] = ()

    def options(self, kind: type[OptionsT]) -> OptionsT:
        """The ``kind`` options given, else its defaults."""
        return next((o for o in self.distro_options if isinstance(o, kind)), None) or kind()

    def driver_run_url(self, version: str, default_base: str | None = None,
                       arch: str = "x86_64") -> str:
        """--driver-url as given, else <base>/<V>/NVIDIA-Linux-<arch>-<V>.run (``arch``:
        the node's, CpuArch.nvidia); the base is --driver-base-url, else the distro's
        ``default_base``, else NVIDIA's for the branch."""
        if self.driver_url:
            return self.driver_url
        return run_url(self.driver_base_url or default_base
                       or NVIDIA_BASE_URL.format(branch=self.driver_branch), version, arch)


OptionsT = TypeVar("OptionsT", bound=DistroOptions)


def validate(settings: Settings) -> Settings:
    """``settings`` checked as a whole and normalised (UsageError on bad input). Pure: no
    file is read (where the install dir is: installdir.locate)."""
    s = settings
    release = s.kernel_release
    if release is not None and not is_kernel_release(release):
        raise UsageError(
            f"--kernel-release {release!r} is not a kernel release",
            hint="give the node's `uname -r`, e.g. 5.15.0-1049-gke (letters, digits and "
            f". - _ + ~, at most {KERNEL_RELEASE_MAX} characters)",
        )
    sha = normalize_sha256(s.driver_sha256 or None, "--driver-sha256")
    if s.lock_timeout_s < 0:
        raise UsageError("--lock-timeout must be >= 0 seconds")
    _check_driver_url_version(s)
    if s.driver_url and s.driver_base_url:
        raise UsageError("--driver-url and --driver-base-url both name where the .run comes "
                         "from: give one (a full URL from NVIDIA_DRIVER_DOWNLOAD_URL wins "
                         "over a base URL from NVIDIA_DRIVER_BASE_URL)")
    if s.driver_version and (why := too_old(s.driver_version)):
        raise UsageError(f"--driver-version: {why}", hint="use R470 or newer")
    if s.kernel_module_type not in MODULE_TYPE_REQUESTS:
        raise UsageError(f"bad --kernel-module-type {s.kernel_module_type!r}",
                         hint="use auto, open or proprietary")
    if not re.fullmatch(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*", s.driver_branch) or \
            ".." in s.driver_branch.split("/"):
        raise UsageError(f"bad --driver-branch {s.driver_branch!r}",
                         hint="a path under NVIDIA's download host, e.g. tesla")
    if s.metrics_file is not None and not PurePosixPath(s.metrics_file).is_absolute():
        raise UsageError(
            f"--metrics-file must be an absolute host path, got {str(s.metrics_file)!r}",
            hint="e.g. /var/lib/node_exporter/textfile_collector/nvidia_driver.prom",
        )
    if not (s.download_deadline_s > 0 and s.download_min_rate >= 0
            and s.download_min_rate_time_s > 0):
        raise UsageError("--download-deadline and --download-min-rate-time must be > 0 "
                         "seconds, --download-min-rate >= 0 bytes/s")
    _check_readiness_deadlines(s)
    _check_gpu_model(s)
    if s.install_only and s.persistence_mode:
        raise UsageError("--install-only loads nothing: it cannot be combined with "
                         "--persistence-mode")
    for options in s.distro_options:
        options.check(s)
    prebuilt_sha = _check_prebuilt(s)
    fm_sha = normalize_sha256(s.fabric_manager_sha256 or None, "--fabric-manager-sha256")
    return replace(s, driver_sha256=sha, prebuilt_sha256=prebuilt_sha,
                   fabric_manager_sha256=fm_sha)


def _check_gpu_model(s: Settings) -> None:
    """--gpu-model only previews: a real run installs for the GPUs it finds."""
    if s.dry_run_gpu_model is None:
        return
    if not s.dry_run:
        raise UsageError("--gpu-model (NVIDIA_DRY_RUN_GPU_MODEL) previews only: it needs "
                         "--dry-run", hint="add --dry-run, or unset it for a real install "
                         "(which plans for the GPUs on the node)")
    gpus.assumed_gpu(s.dry_run_gpu_model)  # an unknown name: UsageError with the list


def _check_readiness_deadlines(s: Settings) -> None:
    if not (0 < s.cuda_check_deadline_s < float("inf")
            and 0 < s.fabric_deadline_s < float("inf")):
        raise UsageError("--cuda-check-deadline and --fabric-deadline must be > 0 seconds")


def _check_driver_url_version(s: Settings) -> None:
    """--driver-url's file name and --driver-version naming two drivers: refused now
    (the .run's own version is checked once extracted, before anything is unloaded)."""
    if not s.driver_url:
        return
    named = named_version(s.driver_url)
    wanted = s.driver_version
    if named and wanted and wanted[:1].isdigit() and named != wanted:
        raise UsageError(f"--driver-url names driver {named} "
                         f"({s.driver_url.split('?', 1)[0].rsplit('/', 1)[-1]}), --driver-version {wanted}",
                         hint="give the URL of the version you want, or drop "
                         "--driver-version (it is read from the URL's file name)")


def _check_prebuilt(s: Settings) -> str | None:
    """The --prebuilt-* options, checked together (the URL template itself when
    parsed: cli.PrebuiltUrl); the sha256 normalised."""
    if s.prebuilt_url is None:
        if s.prebuilt_sha256 or s.prebuilt_only:
            raise UsageError("--prebuilt-sha256 and --prebuilt-only need --prebuilt-url "
                             "(NVIDIA_PREBUILT_URL)")
        return None
    return normalize_sha256(s.prebuilt_sha256 or None, "--prebuilt-sha256")


def full_url_over_base_url(opts: dict[str, Any], flags: set[str]) -> dict[str, str] | None:
    """A full .run URL and a base URL not both given as flags (``flags``): the full URL wins,
    as in GKE's installers (a pool's NVIDIA_DRIVER_DOWNLOAD_URL over a template's
    NVIDIA_DRIVER_BASE_URL); the base URL leaves ``opts`` and what to log about it is
    returned. Two flags that disagree stay a usage error (validate)."""
    if not (opts.get("driver_url") and opts.get("driver_base_url")) or len(flags) == 2:
        return None
    url_from = "--driver-url" if "driver_url" in flags else "NVIDIA_DRIVER_DOWNLOAD_URL"
    base_from = "--driver-base-url" if "driver_base_url" in flags else "NVIDIA_DRIVER_BASE_URL"
    return {"driver_url": opts["driver_url"], "driver_base_url": opts.pop("driver_base_url"),
            "why": f"the full URL ({url_from}) wins over the base URL ({base_from})"}


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
