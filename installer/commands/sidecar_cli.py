"""``sidecar fabric-manager`` and ``sidecar persistenced``: the DaemonSet's daemon sidecars.

Each waits for the driver the install loads, then runs NVIDIA's daemon of that version (the
fabric manager in the foreground, nvidia-persistenced forked and watched: forking.py) and
keeps its state file (services/supervise.py) for the install's readiness and doctor.
A sidecar that cannot start its daemon says why in the state file and exits 9, so the
install fails with that cause instead of waiting out its deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from installer.base import podcontract
from installer.commands.click_types import LOG_FORMATS, Seconds


@click.group("sidecar", short_help="Run an NVIDIA daemon as the DaemonSet's sidecar.")
def sidecar() -> None:
    """NVIDIA's daemons, and the GPU health watcher, as native sidecars (init containers
    with restartPolicy: Always), rendered by `manifests render --nvswitch / --persistenced /
    --health`."""


def _options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed([
        click.option("--install-dir", type=click.Path(path_type=Path),
                     envvar="NVIDIA_INSTALL_DIR_CONTAINER", show_envvar=True,
                     default=str(podcontract.INSTALL_DIR_CONTAINER), show_default=True,
                     help="This container's view of the install dir."),
        click.option("--driver-wait", "driver_wait_s", type=Seconds(open_min=True),
                     envvar="NVIDIA_DRIVER_WAIT", default=7200, show_default=True,
                     show_envvar=True, help="How long to wait for the install to load the "
                     "driver and put this daemon's files in place."),
        click.option("--log-format", type=LOG_FORMATS, envvar="LOG_FORMAT", default="auto",
                     show_default=True, show_envvar=True),
    ]):
        fn = option(fn)
    return fn


def _refuse(install_dir: Path, name: str, exc: Exception) -> None:
    from installer.base.errors import InstallerError
    from installer.services import supervise as daemons

    text = exc.message if isinstance(exc, InstallerError) else str(exc)
    daemons.write_state(install_dir, name, daemons.REFUSED, text)


@sidecar.command("fabric-manager", short_help="NVIDIA's fabric manager (NVSwitch nodes).")
@_options
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              envvar="NVIDIA_FABRIC_MANAGER_CONFIG", show_envvar=True,
              help="A fabricmanager.cfg (e.g. from a ConfigMap) for nv-fabricmanager, which runs "
              "as root with the host's /dev: every file path in it must lie inside the install "
              "dir, or the sidecar refuses it [default: the archive's, in the foreground, "
              "logging to stderr].")
@click.option("--nvlsm", "nvlsm_binary", envvar="NVIDIA_NVLSM", show_envvar=True,
              default="/opt/nvidia/nvlsm/sbin/nvlsm", show_default=True,
              help="NVLink5 nodes: NVIDIA's NVLink subnet manager (the nvlsm package's path).")
@click.option("--nvlsm-config", envvar="NVIDIA_NVLSM_CONFIG", show_envvar=True,
              default="/usr/share/nvidia/nvlsm/nvlsm.conf", show_default=True,
              help="NVLink5 nodes: nvlsm's config, as NVIDIA's start script passes it (-F).")
def fabric_manager(install_dir: Path, driver_wait_s: float, log_format: str,
                   config_file: Path | None, nvlsm_binary: str, nvlsm_config: str) -> int:
    """Wait for the driver, then run nv-fabricmanager of exactly its version (fetched by the
    install into <install-dir>/fabricmanager/<V>) until it exits. On NVLink5 nodes nvlsm is
    started first, as NVIDIA's nvidia-fabricmanager-start.sh does, and watched with it."""
    from installer.kmod.kernel import KernelState
    from installer.log import configure
    from installer.services import fabric, fabricmanager
    from installer.services import sidecar_setup as sidecars
    from installer.services import supervise as daemons

    configure(log_format)
    kernel = KernelState()
    name = daemons.FABRIC_MANAGER
    found = fabric.detect(kernel.sys_dir)
    if not found.present:
        daemons.idle(install_dir, name, "no NVLink fabric on this node: no NVSwitch on the PCI "
                     "bus, no NVLink5 InfiniBand device (VPD with SW_MNG)")
    guid = None
    try:
        daemons.write_state(install_dir, name, daemons.WAITING, "waiting for the driver")
        nvlink5 = found.kind == fabric.NVLINK5
        if nvlink5:  # the image's: no use waiting
            _refuse_nvlink5(sidecars.nvlsm_missing(nvlsm_binary, nvlsm_config))
        version, fm_dir = sidecars.wait_for_driver(
            kernel, sidecars.fabric_manager_files(install_dir), name, driver_wait_s)
        if nvlink5:
            _refuse_nvlink5(sidecars.nvlink5_missing(kernel, found.devices[0]))
            guid = fabricmanager.port_guid(kernel.sys_dir, found.devices[0])
        config = _fabric_config(install_dir, fm_dir, config_file)
    except Exception as exc:
        _refuse(install_dir, name, exc)
        raise
    env = {**kernel.seam_env(), "LD_LIBRARY_PATH": f"{fm_dir / 'lib'}:{install_dir / 'lib64'}"}
    argv = fabricmanager.fabric_manager_argv(fm_dir / "bin/nv-fabricmanager", config, guid)
    if guid is None:
        return daemons.run_foreground(install_dir, name, argv, env)
    nvlsm = fabricmanager.nvlsm_argv(nvlsm_binary, nvlsm_config,
                                     install_dir / daemons.STATE_DIR / "nvlsm.pid", guid)
    return _run_with_nvlsm(install_dir, nvlsm, argv, env)


def _fabric_config(install_dir: Path, fm_dir: Path, config_file: Path | None) -> Path:
    from installer.services import fabricmanager
    from installer.services import sidecar_setup as sidecars
    from installer.services import supervise as daemons

    if config_file is not None:  # the operator's, run by root with the host's /dev
        fabricmanager.check_config(_read_config(config_file), install_dir)
        return config_file
    config = install_dir / daemons.STATE_DIR / "fabricmanager.cfg"
    template = (fm_dir / "etc/fabricmanager.cfg").read_text(errors="replace")
    config.write_text(sidecars.fabric_config(template, fm_dir))
    return config


def _run_with_nvlsm(install_dir: Path, nvlsm: list[str], argv: list[str],
                    env: dict[str, str]) -> int:
    """NVIDIA's order: nvlsm up (its pid file naming a live daemon, bounded), then the fabric
    manager in the foreground; nvlsm dying ends the pod's sidecar (exit 9, named), and
    however the fabric manager ends, nvlsm is stopped with it."""
    from installer.base.errors import VerifyError
    from installer.services import forking
    from installer.services import sidecar_setup as sidecars
    from installer.services import supervise as daemons

    name = daemons.FABRIC_MANAGER
    state_dir = install_dir / daemons.STATE_DIR
    try:
        pid = sidecars.start_nvlsm(nvlsm, Path(nvlsm[nvlsm.index("--pid_file") + 1]), env,
                                   state_dir / "nvlsm.log")
    except Exception as exc:
        _refuse(install_dir, name, exc)
        raise
    watch = sidecars.NvlsmWatch(pid)
    try:
        with watch:
            rc = daemons.run_foreground(install_dir, name, argv, env)
    except sidecars.NvlsmGone:
        daemons.write_state(install_dir, name, daemons.EXITED, watch.died)
        raise VerifyError(watch.died, hint="nvlsm's log (/var/log/nvlsm.log by its config) "
                          "says why; the pod's sidecar restarts both") from None
    finally:
        forking.stop_pid(pid, sidecars.NVLSM_STOP_S)
    return rc


def _read_config(path: Path) -> str:
    from installer.base.errors import UsageError
    from installer.services import fabricmanager

    try:
        with path.open("rb") as f:
            data = f.read(fabricmanager.CONFIG_MAX_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read the fabric manager config {path}: {exc.strerror}",
                         hint="mount the ConfigMap (manifests render --fabric-manager-config)"
                         ) from exc
    if len(data) > fabricmanager.CONFIG_MAX_BYTES:
        raise UsageError(f"the fabric manager config {path} is over 1 MiB",
                         hint="a fabricmanager.cfg is a few KiB: check the ConfigMap")
    return data.decode(errors="replace")


def _refuse_nvlink5(missing: list[str]) -> None:
    """Exit 9 like every sidecar that cannot start its daemon, naming what is missing."""
    from installer.base.errors import VerifyError

    if missing:
        raise VerifyError("NVLink5 node: the fabric cannot complete without "
                          + "; ".join(missing),
                          hint="NVIDIA's NVLink5 prerequisites: the nvlsm package in this "
                          "sidecar's image (or --nvlsm/--nvlsm-config), mlx5_core and ib_umad "
                          "on the node; add what is missing, then restart the pod")


@sidecar.command("persistenced", short_help="nvidia-persistenced.")
@_options
@click.option("--start-wait", "start_wait_s", type=Seconds(open_min=True),
              envvar="NVIDIA_PERSISTENCED_START_WAIT", default=120, show_default=True,
              show_envvar=True, help="How long nvidia-persistenced may take to start (its "
              "parent's exit and its pid file).")
def persistenced(install_dir: Path, driver_wait_s: float, log_format: str,
                 start_wait_s: float) -> int:
    """Wait for the driver, then start its nvidia-persistenced (NVIDIA's way to keep the
    GPUs initialised; 580 calls `nvidia-smi -pm 1` deprecated) as NVIDIA's systemd unit
    does: it forks, and this sidecar watches its pid for as long as the pod lives, writing
    its syslog messages to the container's log. It exits 9 with the reason when the daemon
    fails to start or dies, so that the kubelet restarts it."""
    from installer.kmod.kernel import KernelState
    from installer.log import configure
    from installer.services import forking
    from installer.services import sidecar_setup as sidecars
    from installer.services import supervise as daemons

    configure(log_format)
    kernel = KernelState()
    name = daemons.PERSISTENCED
    try:
        daemons.write_state(install_dir, name, daemons.WAITING, "waiting for the driver")
        _, binary = sidecars.wait_for_driver(kernel, sidecars.persistenced_files(install_dir),
                                             name, driver_wait_s)
    except Exception as exc:
        _refuse(install_dir, name, exc)
        raise
    env = {**kernel.seam_env(), "LD_LIBRARY_PATH": str(install_dir / "lib64")}
    watch = forking.Watch(sidecars.PERSISTENCED_RUN_DIR / "nvidia-persistenced.pid",
                          sidecars.PERSISTENCED_RUN_DIR / "socket", start_wait_s)
    forking.become_subreaper()  # the forked daemon becomes our child: its exit status
    return forking.run_forking(install_dir, name, sidecars.persistenced_argv(binary, install_dir),
                               env, watch, kernel.dev_dir / "log")


@sidecar.command("health", short_help="Watch the GPUs after the install; serve /metrics.")
@click.option("--install-dir", type=click.Path(path_type=Path),
              envvar="NVIDIA_INSTALL_DIR_CONTAINER", show_envvar=True,
              default=str(podcontract.INSTALL_DIR_CONTAINER), show_default=True,
              help="This container's view of the install dir.")
@click.option("--host-root", type=click.Path(path_type=Path), envvar="ROOT_MOUNT_DIR",
              default=str(podcontract.HOST_ROOT), show_default=True, show_envvar=True,
              help="Where the host's / is mounted: the readiness file there gets the verdict "
              "(GPU_HEALTH lines) once the install has written it.")
@click.option("--interval", "interval_s", type=Seconds(open_min=True),
              envvar="NVIDIA_HEALTH_INTERVAL", default=30, show_default=True,
              show_envvar=True, help="Time between two checks (each reads the kernel log, "
              "bounded: 8 MiB, 3 s).")
@click.option("--listen-address", envvar="NVIDIA_METRICS_ADDRESS", show_envvar=True,
              default="0.0.0.0", show_default=True,
              help="Address /metrics and /healthz are served on (127.0.0.1: this node only).")
@click.option("--port", type=click.IntRange(0, 65535), envvar="NVIDIA_METRICS_PORT",
              show_envvar=True, default=9402, show_default=True,
              help="Port of /metrics and /healthz (0: any free one, logged).")
@click.option("--log-format", type=LOG_FORMATS, envvar="LOG_FORMAT", default="auto",
              show_default=True, show_envvar=True)
def health(install_dir: Path, host_root: Path, interval_s: float, listen_address: str, port: int,
           log_format: str) -> int:
    """Check the node's GPUs every --interval seconds after the install: Xid/GSP events in
    the kernel log since the driver's load (the kernel's own records only), GPUs gone from
    the driver, daemon sidecars down, a driver staged for the next boot. The verdict goes to
    <install-dir>/daemons/health.json, to the GPU_HEALTH lines of the readiness file the
    install wrote (never one it did not) and, with the install's own metrics, to /metrics;
    /healthz answers 503 with the reasons while the node needs action. It never changes a
    GPU setting. Runs until the pod stops (docs/health-and-metrics.md)."""
    from installer.base.errors import UsageError
    from installer.host.hostroot import HostRoot
    from installer.host.installdir import InstallDir
    from installer.host.runner import Runner
    from installer.kmod.kernel import KernelState
    from installer.log import configure
    from installer.services import health as checks
    from installer.services.metrics_http import MetricsServer

    configure(log_format)
    kernel = KernelState()
    install = InstallDir(install_dir, podcontract.INSTALL_DIR_HOST)
    watcher = checks.Watcher(install, kernel, Runner(env=kernel.seam_env()), HostRoot(host_root))
    try:
        server = MetricsServer(listen_address, port, lambda: _scrape(watcher),
                               lambda: _healthz(watcher)).start()
    except OSError as exc:
        raise UsageError(f"cannot serve metrics on {listen_address}:{port}: {exc.strerror}",
                         hint="choose a free port (--port / NVIDIA_METRICS_PORT) and an "
                         "address of this pod (--listen-address)") from None
    checks.log.info("health_serving", address=server.host, port=server.port)
    try:
        checks.watch(watcher, interval_s)
    finally:
        server.close()
    return 0


def _scrape(watcher: Any) -> str:
    from installer.services import health as checks

    return (checks.install_metrics(watcher.install, watcher.kernel)
            + checks.format_gauges(watcher.last))


def _healthz(watcher: Any) -> tuple[bool, str]:
    last = watcher.last
    if last is None:
        return False, "not checked yet"
    if last.healthy:
        return True, "ok"
    return False, f"action {last.action}: " + "; ".join(last.problems)
