"""The commands that act on the node (install, detect, status, verify, doctor, uninstall):
their options (those of what "ready" means, docs/node-shapes.md, shared by install and
verify), and the settings they build. ``installer.cli`` loads this module only when
one of them runs (``--help`` lists them without it); each command imports its own flow
when it runs, so a command loads only what it uses.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import click

from installer.base import startup
from installer.base.branches import EXAMPLE_BRANCH
from installer.base.envvars import ENV_RETRIES, ENV_TIMEOUT
from installer.base.errors import EXIT_CODE_MEANINGS
from installer.base.kinds import MODULE_TYPE_REQUESTS
from installer.base.output import FORMATS, plan_text, render
from installer.base.podcontract import DAEMON_NAMES, HOST_ROOT, INSTALL_DIR_HOST
from installer.commands.click_types import LOG_FORMATS, HostPath, Seconds
from installer.distros import DISTROS
from installer.driver.nvidia_urls import DEFAULT_DRIVER_BASE_URL, FABRIC_MANAGER_BASE_URL
from installer.kmod.moduleargs import ModuleArg
from installer.settings import (
    CliOption,
    DistroOptions,
    Settings,
    default_when_in_use,
    full_url_over_base_url,
    retry_env,
    validate,
)


class ModuleArgType(click.ParamType):
    """``MODULE.PARAM=VALUE`` for a module the installer loads (moduleargs.ModuleArg)."""

    name = "MODULE.PARAM=VALUE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from installer.kmod.modules import LOAD_ORDER  # start-up time: only with --module-arg

        if isinstance(value, ModuleArg):
            return value
        try:
            return ModuleArg.parse(str(value), LOAD_ORDER)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class PrebuiltUrl(click.ParamType):
    """A bundle URL template (bundle.manifest.check_template)."""

    name = "URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        # Start-up time: the bundle code only with --prebuilt-url.
        from installer.records.bundle_manifest import BundleError, check_template

        try:
            check_template(str(value))
        except BundleError as exc:
            self.fail(f"{exc} (e.g. https://bundles.example.com/nvidia/ or file:///mnt/bundles/"
                      "nvidia-driver-{driver_version}-{module_type}-{kernel_release}.tar.zst)",
                      param, ctx)
        return str(value)


def _host_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options every command shares: where the host and the install dir are, log format."""
    for option in reversed([
        click.option("--host-root", type=click.Path(path_type=Path), envvar="ROOT_MOUNT_DIR",
                     default=HOST_ROOT, show_default=True, show_envvar=True,
                     help="Where the host's / is mounted in this container."),
        click.option("--install-dir-host", type=HostPath(), envvar="NVIDIA_INSTALL_DIR_HOST",
                     default=str(INSTALL_DIR_HOST), show_default=True, show_envvar=True,
                     help="The install dir as the host sees it."),
        click.option("--install-dir", type=click.Path(path_type=Path),
                     envvar="NVIDIA_INSTALL_DIR_CONTAINER", show_envvar=True,
                     help="This process's view of the install dir [default: /usr/local/nvidia "
                     "if it exists, else <host-root>/<install-dir-host>]"),
        click.option("--kernel-release", envvar="KERNEL_RELEASE", show_envvar=True,
                     help="Target kernel [default: the running kernel, uname -r]."),
        click.option("--log-format", type=LOG_FORMATS, envvar="LOG_FORMAT", default="auto",
                     show_default=True, show_envvar=True,
                     help="auto: JSON when stderr is not a terminal."),
        click.option("-v", "--verbose", is_flag=True, help="Debug logs (commands run, their output)."),
    ]):
        fn = option(fn)
    return fn


def _distro_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Each distro's own options (Distro.options), declared by the distro."""
    for distro in DISTROS:
        if distro.options is not None:
            for spec in reversed(distro.options.cli_options):
                fn = _click_option(spec)(fn)
    return fn


_OPTION_TYPES: dict[str, Callable[[], click.ParamType] | None] = {
    "text": None, "flag": None, "path": lambda: click.Path(path_type=Path), "host_path": HostPath}


def _click_option(spec: CliOption) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The click option a distro declared in words (settings.CliOption)."""
    make_type = _OPTION_TYPES[spec.kind]
    return click.option(spec.flag, envvar=spec.envvar, show_envvar=True, help=spec.help,
                        default=spec.default, show_default=spec.default is not None,
                        is_flag=spec.kind == "flag",
                        type=make_type() if make_type is not None else None)


def _output_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("-o", "--output", type=click.Choice(FORMATS), default="text",
                        show_default=True,
                        help="text: for people; json: for tools.")(fn)


def _auto_output_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``detect``'s -o: docs/contract.md §3 promises JSON to tools and text to people; auto
    gives each theirs (JSON when stdout is not a terminal, as --log-format auto does)."""
    return click.option("-o", "--output", type=click.Choice(["auto", *FORMATS]),
                        default="auto", show_default=True,
                        help="auto: JSON when stdout is not a terminal (a pipe, a file, "
                        "kubectl exec without -t), else text; text: for people; json: for "
                        "tools.")(fn)


def _readiness_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """install and verify: the fabric gate (NVSwitch nodes), the CUDA check
    (installer/services/cuda_check.py) and its way out."""
    fn = click.option("--require-daemon", "required_daemons", multiple=True,
                      type=click.Choice(list(DAEMON_NAMES)),
                      envvar="NVIDIA_REQUIRED_DAEMONS", show_envvar=True,
                      help="A daemon sidecar that must report running before the driver is "
                      "ready (repeatable; the env var: space-separated). manifests render sets "
                      "it for the sidecars it adds.")(fn)
    fn = click.option("--fabric-deadline", "fabric_deadline_s", type=Seconds(open_min=True),
                      envvar="NVIDIA_FABRIC_DEADLINE", default=600, show_default=True,
                      show_envvar=True,
                      help="NVSwitch nodes: how long every GPU's NVLink fabric may take to "
                      "reach Completed (the fabric manager sidecar trains it) before the "
                      "verify fails (exit 9).")(fn)
    fn = click.option("--cuda-check-deadline", "cuda_check_deadline_s",
                      type=Seconds(open_min=True), envvar="NVIDIA_CUDA_CHECK_DEADLINE",
                      default=60, show_default=True, show_envvar=True,
                      help="How long the CUDA check may take before it is stopped and the "
                      "verify fails (exit 9): a hung cuInit cannot hang the installer.")(fn)
    fn = click.option("--cc-set-ready", is_flag=True, envvar="NVIDIA_CC_SET_READY",
                      show_envvar=True,
                      help="Confidential-computing GPUs (H100 CC mode on): set the GPUs' ready "
                      "state (`nvidia-smi conf-compute -srs 1`, once persistenced is up) "
                      "before the CUDA check. It changes a GPU setting: only on your say, "
                      "after you have attested the GPUs.")(fn)
    return click.option("--skip-cuda-check", is_flag=True, envvar="NVIDIA_SKIP_CUDA_CHECK",
                        show_envvar=True,
                        help="Verify with nvidia-smi only, making no CUDA context (nodes "
                        "where one must not be made). Risk: \"verified\" then does not mean a "
                        "CUDA program runs (an NVSwitch fabric not ready, missing UVM files, "
                        "a GPU in exclusive mode all pass nvidia-smi).")(fn)


def _fabric_manager_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """install: NVIDIA's fabric manager archive for NVSwitch nodes (fabricmanager.py)."""
    fn = click.option("--fabric-manager-sha256", envvar="NVIDIA_FABRIC_MANAGER_SHA256",
                      show_envvar=True,
                      help="NVSwitch nodes: the fabric manager archive's SHA-256 [default: "
                      "from redistrib_<V>.json].")(fn)
    return click.option("--fabric-manager-base-url", envvar="NVIDIA_FABRIC_MANAGER_BASE_URL",
                        show_envvar=True, default=FABRIC_MANAGER_BASE_URL, show_default=True,
                        help="NVSwitch nodes: where fabricmanager/linux-x86_64/fabricmanager-"
                        "linux-x86_64-<V>-archive.tar.xz and redistrib_<V>.json are (NVIDIA's "
                        "redistributable area, or a mirror of it).")(fn)


def _settings(**opts: Any) -> Settings:
    import structlog

    from installer.log import configure

    configure(opts.pop("log_format", "auto"), "debug" if opts.pop("verbose", False) else "info")
    # Each distro's own options, where the command has them (install).
    distro_options = tuple(d.options.from_cli(opts) for d in DISTROS
                           if d.options is not None and d.options.given(opts))
    if opts.get("metrics_file"):
        opts["metrics_file"] = PurePosixPath(opts["metrics_file"])
    _register_secrets(opts, distro_options)
    if unused := full_url_over_base_url(opts, _from_command_line("driver_url", "driver_base_url")):
        structlog.get_logger("installer").info("driver_base_url_not_used", **unused)
    opts.update(retry_env(os.environ))
    return validate(Settings(distro_options=distro_options,
                             **{k: v for k, v in opts.items() if v is not None}))


def _follow_output(output: str, opts: dict[str, Any]) -> dict[str, Any]:
    """A report's log lines in its own format (-o), not JSON beside text: only
    a --log-format flag wins over -o; LOG_FORMAT (a pod's env) and auto give way."""
    if not _from_command_line("log_format"):
        opts["log_format"] = "json" if output == "json" else "console"
    return opts


def _from_command_line(*names: str) -> set[str]:
    """Which of these parameters were given as flags (not by env var or default)."""
    flag, source = click.core.ParameterSource.COMMANDLINE, click.get_current_context()
    return {n for n in names if source.get_parameter_source(n) is flag}


def _register_secrets(opts: dict[str, Any], distro_options: tuple[DistroOptions, ...]) -> None:
    """Credentials in the URLs we were given (and in proxy settings) never reach output."""
    from installer.net.policy import register_url

    for key in ("driver_url", "driver_base_url", "prebuilt_url", "fabric_manager_base_url"):
        register_url(opts.get(key))
    for options in distro_options:
        for secret in options.secrets():
            register_url(secret)
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                "all_proxy"):
        register_url(os.environ.get(var))


def _exit_codes_epilog() -> str:
    """The exit codes table (docs/contract.md §3) and two examples, kept as typed (``\\b``)."""
    rows = "\n".join(f"  {int(code):>3}  {meaning}" for code, meaning in EXIT_CODE_MEANINGS.items())
    return (f"\b\nExit codes:\n{rows}\n\n"
            "\b\nEnvironment only (no option):\n"
            f"  {ENV_RETRIES}  attempts per download (1: no retry)\n"
            f"  {ENV_TIMEOUT}  seconds after which no new download attempt starts\n\n"
            "\b\nExamples:\n"
            "  # on the node itself, by hand: print the plan, change nothing\n"
            "  sudo nvidia-driver-installer install --host-root / --dry-run\n"
            "  # a pinned driver, waiting up to 10 minutes for another installer\n"
            "  nvidia-driver-installer install --driver-version 580.82.07 \\\n"
            "      --driver-sha256 <sha256 of the .run> --lock-timeout 600")


@click.command(short_help="Install or load the cached driver; verify it (nvidia-smi, CUDA).",
             epilog=_exit_codes_epilog())
@_host_options
@_readiness_options
@click.option("--driver-version", envvar="NVIDIA_DRIVER_VERSION", show_envvar=True,
              help=f"Driver version, or on COS an alias: default, latest, {EXAMPLE_BRANCH} … "
              "[default: COS: default; Ubuntu: a pinned, tested version]")
@click.option("--driver-url", envvar="NVIDIA_DRIVER_DOWNLOAD_URL", show_envvar=True,
              help="Full URL (https:// or file://) of the NVIDIA .run [default: from --driver-base-url].")
@click.option("--driver-base-url", envvar="NVIDIA_DRIVER_BASE_URL", show_envvar=True,
              help="The .run is <base>/<V>/NVIDIA-Linux-x86_64-<V>.run [default: COS: Google's "
              "regional mirror of NVIDIA's files (as GKE's installer); else "
              f"{DEFAULT_DRIVER_BASE_URL.rsplit('/', 1)[0]}/<--driver-branch>].")
@click.option("--driver-branch", envvar="NVIDIA_DRIVER_BRANCH", show_envvar=True,
              default="tesla", show_default=True,
              help="The path segment under NVIDIA's download host (GKE's Ubuntu installer's "
              "variable).")
@click.option("--driver-sha256", envvar="NVIDIA_DRIVER_SHA256", show_envvar=True,
              help="Expected SHA-256 of the .run (its own checksum is checked anyway).")
@click.option("--kernel-source-path", type=click.Path(path_type=Path),
              envvar="KERNEL_SOURCE_PATH", show_envvar=True,
              help="Kernel headers to build against [default: found on the host, else apt].")
@click.option("--force", is_flag=True, envvar="FORCE_REINSTALL", show_envvar=True,
              help="Reinstall even on a cache hit.")
@click.option("--lock-timeout", "lock_timeout_s", type=Seconds(),
              envvar="LOCK_TIMEOUT", default=0, show_default=True, show_envvar=True,
              help="How long to wait for another installer's lock: seconds, or 90s, 10m, 1h "
              "(0: fail at once, exit 4).")
@click.option("--allow-insecure-http", is_flag=True, envvar="ALLOW_INSECURE_HTTP",
              show_envvar=True, help="Allow plain http:// URLs.")
@click.option("--module-arg", "module_args", multiple=True, envvar="NVIDIA_MODULE_ARGS",
              type=ModuleArgType(), show_envvar=True,
              help="MODULE.PARAM=VALUE for insmod, repeatable (no whitespace in one; the "
              "env var lists them separated by spaces).")
@click.option("--install-only", is_flag=True, envvar="INSTALL_ONLY", show_envvar=True,
              help="Put the driver in the install dir and stop: no module is loaded or "
              "unloaded and nothing is verified (for DaemonSets that load the modules "
              "themselves). Refused while another driver version is loaded.")
@click.option("--when-in-use", type=click.Choice(["fail", "stage"]),
              default=lambda: default_when_in_use(os.environ),
              envvar="WHEN_IN_USE", show_envvar=True,
              show_default="stage in a pod, where KUBERNETES_SERVICE_HOST is set; fail by hand",
              help="When a different driver version is loaded and in use: fail (exit 8, "
              "naming its holders) or stage (build and check the new version, keep it in "
              "<install-dir>/.next-boot, leave the running driver as it is, exit 0; the next "
              "run after a reboot installs it with no download or compile).")
@click.option("--vulkan-icd-dir", type=click.Path(path_type=Path),
              envvar="VULKAN_ICD_DIR_CONTAINER", show_envvar=True,
              help="This process's view of the Vulkan ICD dir [default: "
              "<host-root>/<vulkan-icd-dir-host>].")
@click.option("--vulkan-icd-dir-host", type=HostPath(), envvar="VULKAN_ICD_DIR_HOST",
              show_envvar=True,
              help="Host dir to write NVIDIA's Vulkan ICD file (nvidia_icd.json) to, as GKE's "
              "installer does [default: none written].")
@click.option("--kernel-module-type", type=click.Choice(MODULE_TYPE_REQUESTS),
              envvar="NVIDIA_KERNEL_MODULE_TYPE", default="auto", show_default=True,
              show_envvar=True,
              help="NVIDIA kernel modules to build; auto: by GPU generation (pre-Turing: "
              "proprietary, Blackwell: open, else NVIDIA's default for the branch).")
@click.option("--display-modules", is_flag=True, envvar="NVIDIA_DISPLAY_MODULES",
              show_envvar=True,
              help="Also load nvidia-modeset and nvidia-drm (kernel mode setting, /dev/dri). "
              "CUDA and NVML need neither: by default only nvidia and nvidia-uvm load, as "
              "GKE's Ubuntu installer loads them.")
@_fabric_manager_options
@click.option("--persistence-mode", is_flag=True, envvar="NVIDIA_PERSISTENCE_MODE",
              show_envvar=True, help="After verifying, enable persistence mode (nvidia-smi -pm 1). "
              "Deprecated by NVIDIA (the 580 driver logs so): prefer nvidia-persistenced as a "
              "sidecar, `manifests render --persistenced`.")
@click.option("--metrics-file", envvar="NVIDIA_INSTALLER_METRICS_FILE", show_envvar=True,
              help="Host path of a node_exporter textfile (*.prom) to write the outcome, "
              "duration and driver version to.")
@click.option("--download-deadline", "download_deadline_s", type=Seconds(open_min=True),
              envvar="DOWNLOAD_DEADLINE", default=3600, show_default=True,
              show_envvar=True, help="Seconds one download may take in all, retries included "
              "(exit 5 after).")
@click.option("--download-min-rate", type=click.FloatRange(min=0), envvar="DOWNLOAD_MIN_RATE",
              default=10240, show_default=True, show_envvar=True,
              help="Bytes/s a download must average over each --download-min-rate-time "
              "window, else the attempt is cut off and retried (0: no floor).")
@click.option("--download-min-rate-time", "download_min_rate_time_s",
              type=Seconds(open_min=True), envvar="DOWNLOAD_MIN_RATE_TIME",
              default=60, show_default=True, show_envvar=True,
              help="The window (seconds) --download-min-rate is measured over.")
@click.option("--prebuilt-url", envvar="NVIDIA_PREBUILT_URL", show_envvar=True,
              type=PrebuiltUrl(),
              help="Install a prebuilt bundle (`bundle build`) before compiling: a URL template "
              "(https:// or file://) with {driver_version}, {kernel_release}, {module_type}, or a "
              "directory ending in '/'. Missing (404): compile; bad digest or kernel: exit 6.")
@click.option("--prebuilt-sha256", envvar="NVIDIA_PREBUILT_SHA256", show_envvar=True,
              help="The bundle's SHA-256 [default: from index.json beside the bundles].")
@click.option("--prebuilt-only", is_flag=True, envvar="NVIDIA_PREBUILT_ONLY", show_envvar=True,
              help="Never compile: a missing bundle is exit 5.")
@click.option("--dry-run", is_flag=True, help="Run the pre-flight checks, print the plan; "
              "change nothing.")
@click.option("--gpu-model", "dry_run_gpu_model", envvar="NVIDIA_DRY_RUN_GPU_MODEL",
              show_envvar=True, metavar="MODEL",
              help="With --dry-run on a machine without an NVIDIA GPU: plan as if one MODEL "
              "GPU were there (H100, A100, L4, T4, GB200, … or a PCI device id like 0x2330).")
@_output_option
@_distro_options
def install(output: str, **opts: Any) -> None:
    """Install (or load the cached) driver, then verify it: nvidia-smi, then a CUDA context
    and a memory round trip on every GPU."""
    with startup.loading_modules():  # every node's boot: docs/performance.md
        from installer.commands import install as install_flow

    outcome = install_flow.run(_settings(**opts))
    if outcome.dry_run is not None:
        click.echo(render(outcome.dry_run, output, text=plan_text), nl=False)
    elif output == "json":  # as status.json records it; people read the log's last line
        click.echo(render(outcome.to_status_json(), output), nl=False)


@click.command(short_help="Print the detected host: OS, kernel, flow, GPUs, loaded driver.")
@_host_options
@_auto_output_option
def detect(output: str, **opts: Any) -> None:
    """Print the detected host: OS, kernel, flow, GPUs, loaded driver (JSON when stdout is
    not a terminal, else text: see -o)."""
    from installer import detect as detect_mod

    if output == "auto":
        output = "text" if sys.stdout.isatty() else "json"
    click.echo(render(detect_mod.run(_settings(**_follow_output(output, opts))), output),
               nl=False)


@click.command(short_help="Print status.json and the .cache record; exit with its code.")
@_host_options
@_output_option
def status(output: str, **opts: Any) -> int:
    """Print the last run's status.json and the .cache record; exit with its exit code
    (12 when the installer has not run on this node)."""
    from installer.host.installdir import locate
    from installer.records import status as status_mod

    settings = _settings(**_follow_output(output, opts))  # any OS: only the install dir
    report = status_mod.report(locate(settings.host_root, settings.install_dir,
                                      settings.install_dir_host))
    click.echo(render(report.to_json(), output), nl=False)
    return report.exit_code()


@click.command(short_help="Check the device nodes, nvidia-smi and CUDA (exit 9 if broken).")
@_host_options
@_readiness_options
@_output_option
def verify(output: str, **opts: Any) -> None:
    """Check the installed driver: device nodes, nvidia-smi, then CUDA on every GPU (a
    context and a memory round trip, in a child with a deadline); exit 9 if broken, with the
    CUDA error's cause and fix."""
    from installer.detect import context
    from installer.kmod import devnodes
    from installer.services import verify as verify_mod

    ctx = context(_settings(**_follow_output(output, opts)))
    gpus = verify_mod.check_installed(ctx, devnodes.missing_nodes(ctx.kernel))
    click.echo(render([g.__dict__ for g in gpus], output), nl=False)


@click.command(short_help="Check the node's driver set-up; print each finding with its fix.")
@_host_options
@_output_option
@click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as -o json.")
def doctor(output: str, as_json: bool, **opts: Any) -> int:
    """Check this node's driver set-up; print each finding with a fix.

    Exit 0 when no check fails (warnings allowed), 9 when any fails.
    """
    from installer.commands.doctor import report as doctor_mod
    from installer.log import configure

    as_json = as_json or output == "json"
    _follow_output("json" if as_json else "text", opts)
    log_format, verbose = opts.get("log_format", "auto"), opts.get("verbose", False)
    settings = _settings(**opts)
    configure(log_format, "debug" if verbose else "warning")  # the report is the output
    report = doctor_mod.run(settings)
    click.echo(doctor_mod.render_json(report) if as_json else doctor_mod.render_text(report),
               nl=False)
    return report.exit_code


@click.command(short_help="Unload the modules and remove the install; keep logs and status.")
@_host_options
@click.option("--lock-timeout", "lock_timeout_s", type=Seconds(),
              envvar="LOCK_TIMEOUT", default=0, show_default=True, show_envvar=True,
              help="How long to wait for another installer's lock: seconds, or 90s, 10m, 1h "
              "(0: fail at once, exit 4).")
@click.option("--dry-run", is_flag=True, help="Print what would be unloaded and removed; "
              "change nothing (no lock).")
@_output_option
def uninstall(output: str, **opts: Any) -> None:
    """Unload the NVIDIA modules and remove the install (logs and status.json stay).

    Idempotent. Exit 8 without changing anything if the driver is in use; --dry-run
    refuses the same way and otherwise lists what would go.
    """
    from installer.commands import uninstall as uninstall_mod

    click.echo(render(uninstall_mod.run(_settings(**opts)).to_status_json(), output), nl=False)
