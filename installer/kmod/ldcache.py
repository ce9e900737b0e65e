"""ld caches: the container's (so our tools resolve libnvidia-ml.so.1) and the host's.

The host entry is idempotent: GKE's installers append a line to
/etc/ld.so.conf on every run; we write one drop-in (or one line when the host
has no ld.so.conf.d include) and remove duplicates of our own path.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path, PurePosixPath

import structlog

from installer.base.errors import VerifyError
from installer.base.fsutil import write_atomic
from installer.host.hostroot import HostRoot
from installer.host.runner import CommandError, Runner

log = structlog.get_logger(__name__)

DROP_IN = "nvidia.conf"
LD_SO_CONF = PurePosixPath("/etc/ld.so.conf")
HOST_DROP_IN = PurePosixPath("/etc/ld.so.conf.d") / DROP_IN
LDCONFIG_TIMEOUT_S = 120


def _includes_drop_ins(ld_so_conf: str, drop_in: PurePosixPath) -> bool:
    for line in ld_so_conf.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "include" and fnmatch.fnmatch(str(drop_in), words[1]):
            return True
    return False


def dedupe_entry(text: str, entry: str) -> tuple[str, bool]:
    """Keep the first line equal to ``entry`` and drop the rest; report if one is present."""
    out, seen = [], False
    for line in text.splitlines():
        if line.strip() == entry:
            if seen:
                continue
            seen = True
        out.append(line)
    return "\n".join(out) + ("\n" if out else ""), seen


def plan_host_entry(ld_so_conf: str, lib_dir_host: PurePosixPath) -> tuple[str, bool]:
    """New ld.so.conf text and whether a drop-in file is wanted instead of a line.

    Pure: decides from the host's ld.so.conf alone.
    """
    entry = str(lib_dir_host)
    text, present = dedupe_entry(ld_so_conf, entry)
    if present:
        return text, False  # an older installer's line: keep exactly one
    if _includes_drop_ins(ld_so_conf, HOST_DROP_IN):
        return text, True
    return text + entry + "\n", False


def update_host(host: HostRoot, runner: Runner, lib_dir_host: PurePosixPath) -> None:
    # Host paths: symlinks (an ld.so.conf managed by alternatives, a linked conf dir) are
    # followed inside the host root and kept; never a file of this container.
    original = host.read_text(LD_SO_CONF) or ""
    text, use_drop_in = plan_host_entry(original, lib_dir_host)
    try:
        if text != original:
            host.write_atomic(LD_SO_CONF, text)
        if use_drop_in:
            wanted = f"{lib_dir_host}\n"
            if host.read_text(HOST_DROP_IN) != wanted:
                host.write_atomic(HOST_DROP_IN, wanted)
    except OSError as exc:
        raise VerifyError(
            f"cannot write the host's ld config ({exc.filename or LD_SO_CONF}): "
            f"{exc.strerror or exc}",
            hint="the host's /etc must be writable from the installer (the pod mounts / at "
            "/root); workloads can set LD_LIBRARY_PATH=/usr/local/nvidia/lib64 meanwhile",
            path=str(LD_SO_CONF)) from exc
    _ldconfig(runner, ["ldconfig", "-r", str(host.root)], "host")
    log.info("ld_cache_updated", scope="host", lib_dir_host=str(lib_dir_host))


def our_host_files(host: HostRoot, lib_dir_host: PurePosixPath) -> list[str]:
    """The host files that name ``lib_dir_host`` as ours (what ``remove_host`` changes):
    ld.so.conf with the line, our drop-in (another package's nvidia.conf is not ours)."""
    entry = str(lib_dir_host)
    text = host.read_text(LD_SO_CONF)
    found = []
    if text is not None and any(ln.strip() == entry for ln in text.splitlines()):
        found.append(str(LD_SO_CONF))
    drop_in = host.read_text(HOST_DROP_IN)
    if drop_in is not None and drop_in.strip() == entry:
        found.append(str(HOST_DROP_IN))
    return found


def remove_host(host: HostRoot, runner: Runner, lib_dir_host: PurePosixPath, *,
                refresh: bool = False) -> list[str]:
    """The inverse of ``update_host``: drop our ld.so.conf line(s) and our drop-in, then
    refresh the host ld cache if anything changed (or ``refresh``: the libraries went).
    Returns the host paths changed."""
    changed = []
    entry = str(lib_dir_host)
    ours = our_host_files(host, lib_dir_host)
    if str(LD_SO_CONF) in ours:
        lines = (host.read_text(LD_SO_CONF) or "").splitlines()
        kept = [ln for ln in lines if ln.strip() != entry]
        host.write_atomic(LD_SO_CONF, "\n".join(kept) + ("\n" if kept else ""))
        changed.append(str(LD_SO_CONF))
    if str(HOST_DROP_IN) in ours:
        host.unlink(HOST_DROP_IN)  # only ours: another package's nvidia.conf stays
        changed.append(str(HOST_DROP_IN))
    if changed or refresh:
        _ldconfig(runner, ["ldconfig", "-r", str(host.root)], "host")
    return changed


_LDCONFIG_P_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$")


def parse_ldconfig_p(text: str) -> dict[str, list[str]]:
    """``ldconfig -p`` output -> soname: [paths of 64-bit entries, in lookup order]."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = _LDCONFIG_P_LINE.match(line)
        if m and "64" in m.group(2):  # libc6,x86-64 / libc6,AArch64, not 32-bit libc6
            out.setdefault(m.group(1), []).append(m.group(3))
    return out


def host_entries(host: HostRoot, runner: Runner) -> dict[str, list[str]]:
    """What the host's /etc/ld.so.cache resolves (``parse_ldconfig_p``); CommandError if
    ldconfig cannot read it."""
    cache_file = host.path("/etc/ld.so.cache")
    return parse_ldconfig_p(runner.run(["ldconfig", "-p", "-C", str(cache_file)],
                                       timeout=LDCONFIG_TIMEOUT_S).stdout)


def update_container(runner: Runner, lib_dir: Path, container_root: Path = Path("/")) -> None:
    drop_in = container_root / "etc/ld.so.conf.d" / DROP_IN
    wanted = f"{lib_dir}\n"
    if not drop_in.exists() or drop_in.read_text() != wanted:
        write_atomic(drop_in, wanted)
    argv = ["ldconfig"] if container_root == Path("/") else ["ldconfig", "-r", str(container_root)]
    _ldconfig(runner, argv, "container")
    log.info("ld_cache_updated", scope="container", lib_dir=str(lib_dir))


def _ldconfig(runner: Runner, argv: list[str], scope: str) -> None:
    try:
        runner.run(argv, timeout=LDCONFIG_TIMEOUT_S)
    except CommandError as exc:
        raise VerifyError(
            f"ldconfig failed for the {scope} ld cache: {exc.stderr_tail(3)}",
            hint="check the ld.so.conf files named above",
        ) from exc
