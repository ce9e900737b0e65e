"""NVIDIA's fabric manager for exactly the installed driver: fetched, checked, kept.

NVIDIA publishes it per driver version in its redistributable area, as
``<base>/fabricmanager/<platform>/fabricmanager-<platform>-<V>-archive.tar.xz`` (platform
``linux-x86_64``, or ``linux-sbsa`` on Arm servers: cpuarch.CpuArch.redist), with
``<base>/redistrib_<V>.json`` listing each archive's ``relative_path`` and ``sha256`` (the
manifest nixpkgs' cuda-modules builders read; the archive holds ``bin/nv-fabricmanager``,
``etc/fabricmanager.cfg``, ``share/nvidia/nvswitch/*_topology`` and ``lib/libnvfm.so.1``,
as NVIDIA/yum-packaging-fabric-manager's spec installs them). The fabric manager must be the
driver's own version (its README: "the version of fabricmanager must match the NVIDIA
driver installed").

The download is the .run's machinery (digest pin, resume, retries, deadline; a mirror is
``--fabric-manager-base-url``); the archive goes through archive.extract's checks (no link
out of the tree, no device file, no setuid bit) into ``<install-dir>/fabricmanager/<V>``,
atomically, next to the driver it belongs to, and later runs of the same version reuse it.
Nothing from the archive runs during the install: nv-fabricmanager runs only in its own
sidecar container (services/supervise.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from installer.base.errors import IntegrityError, UsageError
from installer.base.fsutil import remove_tree
from installer.base.safejson import loads
from installer.driver.nvidia_urls import FABRIC_MANAGER_BASE_URL
from installer.jail import archive
from installer.net.fetch import fetch_text
from installer.net.transfer import download

if TYPE_CHECKING:
    from installer.net.session import ArtifactSession

log = structlog.get_logger(__name__)

DEFAULT_BASE_URL = FABRIC_MANAGER_BASE_URL
PLATFORM = "linux-x86_64"  # the default: every caller on an Arm node passes ctx.arch.redist
DIR = "fabricmanager"  # in the install dir: <install-dir>/fabricmanager/<V>
BINARY = "bin/nv-fabricmanager"


def archive_name(version: str, platform: str = PLATFORM) -> str:
    return f"fabricmanager-{platform}-{version}-archive"


def archive_url(base: str, version: str, platform: str = PLATFORM) -> str:
    return (f"{base.rstrip('/')}/fabricmanager/{platform}/"
            f"{archive_name(version, platform)}.tar.xz")


def redistrib_url(base: str, version: str) -> str:
    return f"{base.rstrip('/')}/redistrib_{version}.json"


def pinned_sha256(text: str, version: str, platform: str = PLATFORM) -> str:
    """The archive's sha256 from NVIDIA's redistrib_<V>.json; IntegrityError when the
    document does not list exactly this version's archive for ``platform``."""
    try:
        entry = loads(text, max_bytes=1 << 20)["fabricmanager"][platform]
        path, sha = entry["relative_path"], entry["sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        raise IntegrityError(f"redistrib_{version}.json lists no fabric manager for "
                             f"{platform}") from exc
    wanted = f"{archive_name(version, platform)}.tar.xz"
    if not str(path).endswith(wanted) or not isinstance(sha, str):
        raise IntegrityError(f"redistrib_{version}.json names {str(path)[:120]!r}, not the "
                             f"fabric manager of driver {version}")
    return sha


def version_dir(install_root: Path, version: str) -> Path:
    return install_root / DIR / version


def installed(install_root: Path, version: str) -> bool:
    return (version_dir(install_root, version) / BINARY).is_file()


def fetch_into(install_root: Path, version: str, *, session: ArtifactSession, base_url: str,
               sha256: str | None, platform: str = PLATFORM) -> Path:
    """Download, check and unpack the fabric manager of ``version`` into the install dir
    (other versions' trees removed); its directory."""
    target = version_dir(install_root, version)
    if installed(install_root, version):
        log.info("fabric_manager_cached", path=str(target))
        return target
    if sha256 is None:
        doc = fetch_text(session, redistrib_url(base_url, version))
        if doc is None:
            raise IntegrityError(f"no redistrib_{version}.json under {base_url}: the fabric "
                                 "manager's digest is unknown",
                                 hint="pin it with --fabric-manager-sha256 "
                                 "(NVIDIA_FABRIC_MANAGER_SHA256)")
        sha256 = pinned_sha256(doc, version, platform)
    work = install_root / DIR / f".{version}.download"
    remove_tree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        name = archive_name(version, platform)
        got = download(session, archive_url(base_url, version, platform),
                       work / f"{name}.tar.xz", expected_sha256=sha256,
                       label="fabric manager")
        unpacked = work / "tree"
        archive.extract(got.path, unpacked, label=got.path.name)
        top = unpacked / name
        if not (top / BINARY).is_file():
            raise IntegrityError(f"{got.path.name} has no {name}/{BINARY}")
        for old in (install_root / DIR).iterdir():
            if old.name != work.name and not old.name.startswith("."):
                remove_tree(old, ignore_errors=True)
        shutil.move(str(top), str(target))
    finally:
        remove_tree(work, ignore_errors=True)
    log.info("fabric_manager_installed", version=version, path=str(target))
    return target


CONFIG_MAX_BYTES = 1 << 20


def check_config(text: str, install_dir: Path) -> None:
    """An operator's fabricmanager.cfg (``sidecar fabric-manager --config``, a ConfigMap) is
    handed to nv-fabricmanager, a root daemon with the host's /dev: every value that names a
    file (holds a ``/``: log file, state file, topology path, socket) must lie inside the
    install dir, else UsageError naming the key. Whoever edits the ConfigMap would otherwise
    choose which host paths a root process writes."""
    root = os.path.realpath(install_dir)
    for number, line in enumerate(text.splitlines(), 1):
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key.startswith("#") or "/" not in value:
            continue
        real = os.path.realpath(value) if os.path.isabs(value) else None
        if real is None or os.path.commonpath([root, real]) != root:
            raise UsageError(
                f"fabric manager config line {number}: {key}={value[:200]!r} is outside the "
                f"install dir {install_dir}", path=str(install_dir),
                hint="every file the fabric manager uses must be an absolute path inside the "
                "install dir (or leave --config out to use NVIDIA's own, made fit for the pod)")


# NVLink5 (HGX B200/B300): NVIDIA's nvidia-fabricmanager-start.sh (the archive's bin/, run by
# gpu-driver-container's _start_daemons with --mode start --fm-config-file --fm-pid-file
# --nvlsm-config-file --nvlsm-pid-file) starts the NVLink subnet manager first, in the
# background, then the fabric manager, both told the management port's GUID. A node running
# it shows (systemd status of nvidia-fabricmanager, nvlsm 2025.10.14, FM 610.57.04):
#   /opt/nvidia/nvlsm/sbin/nvlsm -F /usr/share/nvidia/nvlsm/nvlsm.conf -B \
#       --pid_file /var/run/nvidia-fabricmanager/nvlsm.pid -g 0x7425540300353de9
#   /usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg -g 0x74...de9
# nvlsm's pid below the fabric manager's, its "Entering MASTER state" before the fabric
# manager's "Successfully configured". The GUID is the SW_MNG bridge port's (FM user guide,
# FM_SM_MGMT_PORT_GUID: "queried from the CX device ... populated by the FM service startup
# script"; a command-line -g takes precedence over the config).
NVLSM_BINARY = "/opt/nvidia/nvlsm/sbin/nvlsm"  # the nvlsm package's path (its own package)
NVLSM_CONFIG = "/usr/share/nvidia/nvlsm/nvlsm.conf"  # gpu-driver-container nvlsm_config_file


def port_guid(sys_dir: Path, ib_device: str) -> str | None:
    """The GUID of port 1 of ``ib_device`` as ibstat prints it (``0x`` and 16 hex digits):
    the interface id, the low 64 bits, of the port's GID 0 (rdma-core libibumad
    ``umad_get_port`` reads ``ports/<n>/gids/0`` for ``port_guid``); None when unreadable."""
    try:
        gid = (Path(sys_dir) / "class/infiniband" / ib_device / "ports/1/gids/0").read_text()
    except OSError:
        return None
    groups = gid.strip().split(":")
    if len(groups) != 8 or not all(len(g) == 4 for g in groups):
        return None
    try:
        return f"0x{int(''.join(groups[4:]), 16):016x}"
    except ValueError:
        return None


def nvlsm_argv(binary: str, config: str, pid_file: Path, guid: str) -> list[str]:
    """nvlsm as NVIDIA's start script runs it: its config, in the background (``-B``), its pid
    file, the management port's GUID; nothing else."""
    return [binary, "-F", config, "-B", "--pid_file", str(pid_file), "-g", guid]


def fabric_manager_argv(binary: Path, config: Path, guid: str | None) -> list[str]:
    """nv-fabricmanager with its config; on NVLink5 also the port GUID (``-g``)."""
    return [str(binary), "-c", str(config), *(["-g", guid] if guid else [])]
