"""``/cos-gpu-installer``: cos-gpu-installer v2's command line, translated into ours.

GKE's COS DaemonSets run ``/cos-gpu-installer install [--version=latest]`` from
``bash -c`` (container-engine-accelerators ``nvidia-driver-installer/cos/
daemonset-preloaded*.yaml``). v2 parses flags with Go's ``flag`` package
(``-f`` and ``--f`` alike, ``-f=v`` or ``-f v``, booleans ``-f`` or ``-f=true``);
its ``install`` flags are in cos/tools ``src/cmd/cos_gpu_installer/internal/
commands/install.go`` (SetFlags, validateFlags). Each one maps to an option of
ours or is refused (exit 2, naming it). The env vars the manifests set are read
by our own CLI, so they pass through unchanged.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping

from installer.base.errors import ExitCode, UsageError

USAGE = """\
usage: /cos-gpu-installer install [-version=default|latest|R<branch>|<version>] [flags]

cos-gpu-installer v2's command line, run by nvidia-driver-installer. Flags:
  -version V               driver version or alias (default: the COS build's default)
  -host-dir PATH           host install dir (default: $NVIDIA_INSTALL_DIR_HOST)
  -prepare-build-tools     only cache the COS toolchain and kernel headers
  -module-arg M.P=V        kernel module parameter (repeatable)
  -gcs-download-bucket B, -gcs-download-prefix P   where the COS artifacts are
  -nvidia-installer-url U  with -allow-unsigned-driver: install this .run
  -allow-unsigned-driver   accepted (signed modules are used whenever the kernel enforces them)
  -no-verify               install into the host dir only: load and verify nothing
                           (nvidia-driver-installer install --install-only)
  -debug                   debug logs
Refused: -test, -signature-url, -nvidia-installer-url-open.
See `nvidia-driver-installer install --help` for everything else.
"""

_BOOL = {"allow-unsigned-driver", "debug", "test", "prepare-build-tools", "no-verify"}
_VALUE = {"version", "host-dir", "gcs-download-bucket", "gcs-download-prefix",
          "nvidia-installer-url", "signature-url", "nvidia-installer-url-open", "module-arg"}
_REFUSED = {
    "test": "v2's test mode (unofficial installers, dev-channel images) has no equivalent",
    "signature-url": "module signatures come only from the COS build's artifacts",
    "nvidia-installer-url-open": "the open modules come from the COS build or the --version "
                                 "given; use nvidia-driver-installer install --kernel-module-type",
}
# glog's flags, which v2 accepts before the command; -v >= 2 is its debug level.
_GLOBAL_BOOL = {"logtostderr", "alsologtostderr"}
_GLOBAL_VALUE = {"v", "stderrthreshold", "log_dir", "vmodule", "log_backtrace_at"}
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
ARTIFACTS_BASE = "https://storage.googleapis.com"


def _flags(args: list[str], bools: set[str], values: set[str],
           where: str) -> tuple[list[tuple[str, str]], list[str]]:
    """Go ``flag`` parsing: (name, value) pairs in order, and the arguments after them."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return out, args[i + 1:]
        if not arg.startswith("-") or arg == "-":
            return out, args[i:]
        name, eq, value = arg.lstrip("-").partition("=")
        if name in bools:
            if eq and value.lower() not in ("true", "false", "1", "0", "t", "f"):
                raise UsageError(f"cos-gpu-installer: flag -{name} takes true or false, "
                                 f"got {value!r}")
            out.append((name, "false" if value.lower() in ("false", "0", "f") else "true"))
        elif name in values:
            if not eq:
                if i + 1 >= len(args):
                    raise UsageError(f"cos-gpu-installer: flag -{name} needs a value")
                i += 1
                value = args[i]
            out.append((name, value))
        else:
            raise UsageError(f"cos-gpu-installer: unknown flag {arg.partition('=')[0]} {where}",
                             hint="run /cos-gpu-installer help for the flags it accepts")
        i += 1
    return out, []


def translate(argv: list[str], env: Mapping[str, str]) -> list[str]:
    """v2 argv (after the program name) and env -> our argv. UsageError on a bad/refused flag."""
    global_flags, rest = _flags(argv, _GLOBAL_BOOL, _GLOBAL_VALUE, "before the command")
    verbose = any(n == "v" and v.isdigit() and int(v) >= 2 for n, v in global_flags)
    if not rest:
        raise UsageError("cos-gpu-installer: no command given", hint="use: install")
    command, args = rest[0], rest[1:]
    if command != "install":
        raise UsageError(f"cos-gpu-installer: command {command!r} is not supported",
                         hint="only install is (list: see the COS build's gpu_*_version files)")
    flags, extra = _flags(args, _BOOL, _VALUE, "for install")
    if extra:
        raise UsageError(f"cos-gpu-installer: unexpected argument {extra[0]!r} after the flags")
    given = dict(flags)  # Go's flag package: the last one wins
    for name in _REFUSED:
        if given.get(name, "false") not in ("false", ""):
            raise UsageError(f"cos-gpu-installer: flag -{name} is not supported: "
                             f"{_REFUSED[name]}")
    if given.get("nvidia-installer-url"):
        if given.get("version"):  # validateFlags: mutually exclusive
            raise UsageError("cos-gpu-installer: -nvidia-installer-url and -version are both "
                             "set; these flags are mutually exclusive")
        if given.get("allow-unsigned-driver") != "true":
            raise UsageError("cos-gpu-installer: -nvidia-installer-url must be used with "
                             "-allow-unsigned-driver")

    ours = ["install"]
    if given.get("version"):
        ours += ["--driver-version", given["version"]]
    host_dir = given.get("host-dir")
    if host_dir and host_dir != env.get("NVIDIA_INSTALL_DIR_HOST"):
        # v2 bind-mounts -host-dir over /usr/local/nvidia; that mount is the env's dir,
        # so this process reaches a different host dir through the host root.
        root = (env.get("ROOT_MOUNT_DIR") or "/root").rstrip("/")
        ours += ["--install-dir-host", host_dir, "--install-dir", f"{root}/{host_dir.lstrip('/')}"]
    if "gcs-download-bucket" in given or "gcs-download-prefix" in given:
        ours += ["--cos-artifacts-url", _artifacts_url(given.get("gcs-download-bucket") or
                                                       "cos-tools",
                                                       given.get("gcs-download-prefix") or "")]
    if given.get("nvidia-installer-url"):
        ours += ["--driver-url", given["nvidia-installer-url"]]
    if given.get("prepare-build-tools") == "true":
        ours.append("--preload")
    if given.get("no-verify") == "true":
        # v2: "Skip kernel module loading and installation verification. Useful for
        # preloading drivers without attached GPU." (cos/tools, commit b39f30b "add flag
        # --no-verify"; internal/commands/install.go SetFlags l.175: no GPU is then only
        # logged, l.226; internal/installer/installer.go loadGPUDrivers l.535 loads nothing,
        # VerifyDriverInstallation l.52 runs neither nvidia-smi nor nvidia-modprobe; the
        # cache and the host ld cache are still written). GKE's confidential-node
        # DaemonSets (daemonset-confidential*.yaml) run it, then insmod the modules and run
        # nvidia-modprobe themselves. Ours: --install-only (docs/nvidia-facts.md).
        ours.append("--install-only")
    if verbose or given.get("debug") == "true":
        ours.append("--verbose")
    ours += [x for name, value in flags if name == "module-arg" for x in ("--module-arg", value)]
    return ours


def _artifacts_url(bucket: str, prefix: str) -> str:
    """v2 reads <bucket>/<prefix>/<artifact>; its default prefix is the COS build and the
    node's board, ``<BUILD_ID>/<board>`` (src/pkg/cos/artifacts.go ``NewGCSDownloader``:
    ``path.Join(e.BuildNumber(), e.Board())``): on an arm64 node (board lakitu-arm64)
    the board-less directory would hold x86_64's files (distros/cos/boards.py)."""
    if not _BUCKET.match(bucket):
        raise UsageError(f"cos-gpu-installer: -gcs-download-bucket {bucket!r} is not a "
                         "bucket name", hint="give the bare name, e.g. cos-tools-eu")
    prefix = prefix.strip("/")
    if prefix and (any(part in ("", ".", "..") for part in prefix.split("/"))
                   or any(c in prefix for c in "?#%\\ ")):
        raise UsageError(f"cos-gpu-installer: -gcs-download-prefix {prefix!r} is not a path "
                         "inside the bucket")
    return f"{ARTIFACTS_BASE}/{bucket}/{prefix or '{build_id}/{board}'}"


_HELP = {"-h", "--help", "-help", "--h"}


def _wants_help(args: list[str]) -> bool:
    """``help [install]``, or -h/-help/--help anywhere before ``--`` (Go's flag package
    answers flag.ErrHelp with the usage, v2's subcommands ``help install`` likewise)."""
    flags = args[:args.index("--")] if "--" in args else args
    return (bool(args) and args[0] == "help") or any(a in _HELP for a in flags)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or _wants_help(args):
        (sys.stdout if args else sys.stderr).write(USAGE)
        sys.exit(0 if args else int(ExitCode.USAGE))
    import os

    try:
        ours = translate(args, os.environ)
    except UsageError as exc:
        hint = f" ({exc.hint})" if getattr(exc, "hint", None) else ""
        sys.stderr.write(f"{exc}{hint}\n")
        sys.exit(int(ExitCode.USAGE))
    from installer.cli import main as installer_main

    installer_main(ours)
