"""The COS build tools cache: the cross toolchain and kernel headers of a build, on the host.

GKE mounts the host's ``/var/lib/cos-tools`` at ``/build/cos-tools`` so the
tools survive pod restarts. We keep one directory per COS build in it::

    <tools-dir>/<BUILD_ID>/toolchain/        the cross toolchain (bin/, usr/...)
    <tools-dir>/<BUILD_ID>/kernel-headers/   kernel-headers.tgz, extracted
    <tools-dir>/<BUILD_ID>/.downloads/       archives while they are fetched

A tree is used only when its marker file (written last) exists, so a run
killed while extracting leaves nothing a later run trusts. When the current
build's tools are ready, directories of other builds we made (after a node
upgrade) are removed.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from installer import __version__
from installer.base import podcontract, safejson
from installer.base.dataclass import dataclass
from installer.base.errors import BuildError, IntegrityError
from installer.base.fsutil import UnreadableFile, read_limited, remove_tree, write_atomic
from installer.host.hostroot import HostRoot
from installer.host.runner import CommandError, Runner
from installer.jail import archive
from installer.net.policy import redact_url

log = structlog.get_logger(__name__)

TOOLS_DIR_CONTAINER = podcontract.COS_TOOLS_DIR_CONTAINER
TOOLS_DIR_HOST = str(podcontract.COS_TOOLS_DIR_HOST)
MARKER = ".nvidia-driver-installer.json"
# Rust parts of the COS toolchain are large and never needed for modules
# (Google's installers skip them too).
TOOLCHAIN_EXCLUDES = (
    "usr/lib64/rustlib*",
    "usr/lib64/libstd-*.so",
    "lib/libstd-*.so",
    "lib/librustc*",
    "usr/lib64/librustc*",
)
# What toolchain_env may set. COS writes only CC and CXX into it (cos/tools
# src/cmd/cos_kernel_devenv/devenv.sh kernel_build: `echo "CC=${CC}" > toolchain_env`,
# `echo "CXX=${CXX}" >>`); v2 (src/pkg/cos/cos.go SetCompilationEnv) and v1
# (entrypoint.sh set_compilation_env: "toolchain_env file will set 'CC' and 'CXX'")
# read it for those. The other tools are the ones devenv.sh's set_compilation_env
# exports beside them (LD, HOSTCC, HOSTCXX, HOSTLD, OBJCOPY, STRIP, LLVM_IAS=1) and the
# binutils kbuild runs. Each names a tool of the toolchain; nothing takes flags
# (KCFLAGS, CROSS_COMPILE-style prefixes, PATH ...): a value here runs as root.
TOOL_VARS = ("CC", "CXX", "LD", "AR", "NM", "OBJCOPY", "OBJDUMP", "STRIP", "READELF",
             "HOSTCC", "HOSTCXX", "HOSTLD", "HOSTAR")
SWITCH_VARS = ("LLVM", "LLVM_IAS")  # kbuild's 0/1 switches (tools then come from PATH)
COMPILE_ENV_KEYS = TOOL_VARS + SWITCH_VARS
# A bare tool name (looked up on PATH, the toolchain's bin/ first), or an absolute path
# that must be inside the toolchain (check_tool_paths). No whitespace (extra words: a
# `-wrapper`), no shell or make metacharacters, no leading '-' (an option), no '='.
_TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_+][A-Za-z0-9._+-]{0,127}$")
_TOOL_PATH_RE = re.compile(r"^(/[A-Za-z0-9_+][A-Za-z0-9._+-]*){1,32}$")
_BUILD_DIR_RE = re.compile(r"^\d+(\.\d+)+$")
_COMPILER_SUFFIXES = ("gcc", "cc", "clang", "g++", "c++", "clang++")


def default_tools_dir(explicit: Path | None, host: HostRoot,
                      host_dir: str = TOOLS_DIR_HOST) -> Path:
    """``--toolchain-dir``, else ``/build/cos-tools`` if mounted, else the host's dir
    (``--toolchain-dir-host``, GKE's ``COS_TOOLS_DIR_HOST``)."""
    if explicit is not None:
        return explicit
    if TOOLS_DIR_CONTAINER.is_dir():
        return TOOLS_DIR_CONTAINER
    return host.resolve(host_dir)  # a symlinked /var resolves on the host, not here


@dataclass(frozen=True)
class BuildTools:
    """The tools of one COS build under the tools dir."""

    tools_dir: Path
    build_id: str

    @property
    def root(self) -> Path:
        return self.tools_dir / self.build_id

    @property
    def toolchain(self) -> Path:
        return self.root / "toolchain"

    @property
    def headers(self) -> Path:
        return self.root / "kernel-headers"

    @property
    def downloads(self) -> Path:
        return self.root / ".downloads"

    def toolchain_ready(self, cc: str, sha256: str | None = None) -> bool:
        return _marked(self.toolchain, sha256) and compiler_path(self.toolchain, cc).exists()

    def headers_ready(self, sha256: str | None = None) -> bool:
        return _marked(self.headers, sha256)


def _marked(tree: Path, sha256: str | None) -> bool:
    """The tree was completely extracted (and, when pinned, from the pinned archive)."""
    marker = read_marker(tree)
    return marker is not None and (sha256 is None or marker.get("sha256") == sha256)


def read_marker(tree: Path) -> dict[str, Any] | None:
    try:
        doc = safejson.loads(read_limited(tree / MARKER, 1 << 16), max_bytes=1 << 16)
    except (OSError, ValueError, UnreadableFile):
        return None
    return doc if isinstance(doc, dict) else None


def install_archive(
    archive_path: Path,
    dest: Path,
    *,
    source_url: str,
    sha256: str | None,
    label: str,
    exclude_patterns: tuple[str, ...] = (),
) -> archive.ExtractResult:
    """Extract ``archive_path`` safely into ``dest`` (replacing an incomplete one), mark it."""
    if dest.exists() or dest.is_symlink():
        log.info("build_tools_replaced", path=str(dest), reason="incomplete or stale")
        remove_tree(dest)
    result = archive.extract(
        archive_path, dest, label=label,
        exclude=archive.exclude_patterns(exclude_patterns) if exclude_patterns else None,
    )
    write_atomic(dest / MARKER, json.dumps({
        "source_url": source_url,
        "sha256": sha256,
        "files": result.files,
        "skipped": len(result.skipped),
        "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "installer_version": __version__,
    }, indent=2) + "\n")
    archive_path.unlink(missing_ok=True)
    return result


# --------------------------------------------------------------------------- headers


def find_kernel_tree(headers_root: Path, release: str) -> Path:
    """The kernel build tree inside extracted ``kernel-headers.tgz``.

    COS ships ``usr/src/linux-headers-<release>/``; an archive holding the tree
    at its top level is accepted too.
    """
    exact = headers_root / "usr/src" / f"linux-headers-{release}"
    if (exact / "Makefile").is_file():
        return exact
    found = sorted(p.parent for p in headers_root.glob("usr/src/*/Makefile"))
    if len(found) == 1:
        log.warning("kernel_headers_release_differs", path=str(found[0]), kernel_release=release)
        return found[0]
    if not found and (headers_root / "Makefile").is_file():
        return headers_root
    what = ", ".join(p.name for p in found) if found else "no kernel tree"
    raise BuildError(
        f"kernel-headers.tgz of this build has no headers for kernel {release} ({what})",
        hint="the artifacts do not match the running kernel; check --cos-artifacts-url, "
        "or pass --kernel-source-path",
        path=str(headers_root),
        kernel_release=release,
    )


# --------------------------------------------------------------------------- toolchain


def _first_word(value: str) -> str:
    return value.split()[0] if value.split() else ""


def _refuse(var: str, value: str, source: str, why: str) -> IntegrityError:
    shown = redact_url(source)
    return IntegrityError(
        f"{shown} sets {var}={value[:80]!r}: {why}; refusing to build with it",
        hint=f"toolchain_env may set {', '.join(TOOL_VARS)} to a tool of the toolchain (a "
        f"bare name or a path inside it) and {', '.join(SWITCH_VARS)} to 0 or 1; check the "
        "artifacts URL, or pin the build with --cos-artifacts-sha256",
        url=shown, variable=var)


def check_toolchain_env(env: Mapping[str, str], source: str) -> None:
    """IntegrityError (exit 6) naming the first variable of toolchain_env that is not a
    known tool variable naming a tool (:data:`TOOL_VARS`), or a 0/1 switch."""
    for var, value in env.items():
        if var in SWITCH_VARS:
            if value not in ("", "0", "1"):
                raise _refuse(var, value, source, "it can only be 0 or 1")
        elif var not in TOOL_VARS:
            raise _refuse(var, value, source, "not a toolchain variable")
        elif value and not _TOOL_NAME_RE.match(value) and not (
                _TOOL_PATH_RE.match(value) and not _has_dot_parts(value)):
            raise _refuse(var, value, source, "not the name or path of one tool (no "
                          "arguments, options, '=' or shell characters)")


def _has_dot_parts(path: str) -> bool:
    return any(part in (".", "..") for part in path.split("/"))


def check_tool_paths(env: Mapping[str, str], toolchain: Path, source: str) -> None:
    """A tool named by an absolute path must be inside the toolchain dir."""
    for var in TOOL_VARS:
        value = env.get(var, "")
        if os.path.isabs(value) and not value.startswith(f"{toolchain}/"):
            raise _refuse(var, value, source, f"a path outside the toolchain ({toolchain})")


def compiler_path(toolchain: Path, cc: str) -> Path:
    word = _first_word(cc)
    return Path(word) if os.path.isabs(word) else toolchain / "bin" / word


def _target_prefix(cc: str) -> str:
    """``x86_64-cos-linux-gnu-clang`` -> ``x86_64-cos-linux-gnu-``."""
    name = os.path.basename(_first_word(cc))
    head, sep, tail = name.rpartition("-")
    return head + sep if sep and tail in _COMPILER_SUFFIXES else ""


def cross_linker(toolchain: Path, env: Mapping[str, str]) -> Path | None:
    """The toolchain's linker for CC's target (``LD`` from toolchain_env when given)."""
    bin_dir = toolchain / "bin"
    if env.get("LD"):
        cands = [_first_word(env["LD"])]
    else:
        prefix = _target_prefix(env.get("CC", ""))
        clang = "clang" in os.path.basename(_first_word(env.get("CC", "")))
        lld = [f"{prefix}ld.lld", "ld.lld"]
        bfd = [f"{prefix}ld", f"{prefix}ld.bfd"] if prefix else []
        cands = lld + bfd if clang else bfd + lld
    for cand in cands:
        path = Path(cand) if os.path.isabs(cand) else bin_dir / cand
        if path.exists() and path.name != "ld":
            return path
    return None


def module_linker(toolchain: Path, env: Mapping[str, str]) -> Path:
    """The toolchain's lld (COS 85+ kernels are linked with it), as Google's installer."""
    bin_dir = toolchain / "bin"
    prefix = _target_prefix(env.get("CC", ""))
    for name in ("ld.lld", f"{prefix}ld.lld"):
        if (bin_dir / name).is_file():
            return bin_dir / name
    found = cross_linker(toolchain, env)
    if found is None or not found.name.endswith("ld.lld"):
        raise BuildError(f"the COS toolchain has no ld.lld in {bin_dir}", path=str(bin_dir),
                         hint="remove the tools dir to fetch the toolchain again")
    return found


def link_ld(toolchain: Path, env: Mapping[str, str]) -> Path | None:
    """``bin/ld`` -> the cross linker, so nvidia-installer (which runs ``ld``) uses it.

    A real ``bin/ld`` shipped by the toolchain is left alone; our own link is
    refreshed. Returns the linker ``ld`` resolves to, or None if there is none.
    """
    ld = toolchain / "bin" / "ld"
    if ld.exists() and not ld.is_symlink():
        return ld
    target = cross_linker(toolchain, env)
    if target is None:
        log.warning("toolchain_without_cross_linker", toolchain=str(toolchain),
                    cc=env.get("CC"), hint="nvidia-installer will use the container's ld")
        return None
    rel = os.path.relpath(target, ld.parent)
    if ld.is_symlink():
        if os.readlink(ld) == rel:
            return target
        ld.unlink()
    os.symlink(rel, ld)
    log.info("toolchain_ld_linked", link=str(ld), target=rel)
    return target


def compile_env(toolchain: Path, env: Mapping[str, str], base_path: str) -> dict[str, str]:
    """The environment nvidia-installer builds with: CC/CXX from toolchain_env, the
    toolchain's bin first on PATH, SYSROOT when the toolchain has one."""
    # Checked when toolchain_env was read (check_toolchain_env): known keys only.
    out = {k: env[k] for k in COMPILE_ENV_KEYS if env.get(k)}
    out["PATH"] = f"{toolchain / 'bin'}:{base_path}"
    sysroots = sorted(p for p in (toolchain / "usr").glob("*-linux-gnu") if p.is_dir())
    if sysroots:
        out["SYSROOT"] = str(sysroots[0])
    # COS kernels are built without module versioning (no Module.symvers to check).
    out["IGNORE_MISSING_MODULE_SYMVERS"] = "1"
    return out


def check_compiler(toolchain: Path, env: Mapping[str, str]) -> None:
    cc = compiler_path(toolchain, env.get("CC", ""))
    if not cc.exists():
        raise BuildError(
            f"the COS toolchain has no compiler {env.get('CC')!r} (looked for {cc})",
            hint="toolchain_env and the toolchain archive of this build disagree; "
            "remove the tools dir to fetch them again",
            path=str(cc),
        )
    if not os.access(cc, os.X_OK):
        raise BuildError(f"the COS compiler {cc} is not executable", path=str(cc))


def ensure_exec(path: Path, runner: Runner) -> None:
    """The toolchain runs from the tools dir: clear ``noexec`` on its mount if set
    (hostPath mounts of /var on COS are noexec)."""
    try:
        noexec = bool(os.statvfs(path).f_flag & os.ST_NOEXEC)
    except OSError:
        return
    if not noexec:
        return
    log.info("tools_dir_remount_exec", path=str(path))
    try:
        runner.run(["mount", "--bind", path, path])
        runner.run(["mount", "-o", "remount,bind,exec", path])
    except CommandError as exc:
        raise BuildError(
            f"{path} is on a noexec mount and cannot be remounted exec: {exc.stderr_tail(2)}",
            hint="mount the COS tools dir without noexec, or point --toolchain-dir "
            "(COS_TOOLS_DIR_CONTAINER) at an exec mount",
            path=str(path),
        ) from exc


def prune_other_builds(tools_dir: Path, keep_build_id: str) -> list[str]:
    """Remove tools of other COS builds that we made (a node upgrade leaves them behind)."""
    removed: list[str] = []
    try:
        entries = list(tools_dir.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if entry.name == keep_build_id or not _BUILD_DIR_RE.match(entry.name):
            continue
        if entry.is_symlink() or not entry.is_dir():
            continue
        ours = any((entry / sub / MARKER).exists() for sub in ("toolchain", "kernel-headers"))
        if ours:
            remove_tree(entry)
            removed.append(entry.name)
    if removed:
        log.info("build_tools_pruned", builds=removed, kept=keep_build_id)
    return removed
