"""Read-only by construction: what the GPU tier may run, checked before anything runs.

Every process this tier starts (pytest itself, each installer command, each namespace
helper) installs ``install()``: a ``sys.addaudithook`` hook that sees every
``subprocess.Popen``, ``os.exec*``, ``os.posix_spawn`` and ``os.system`` of the process
(the installer's own Runner included) and every ``open`` for writing, and raises
``Refused`` before the call happens when it would:

- load or unload a kernel module: rmmod, insmod, modprobe, depmod, kmod (but ``kmod list``),
  ``nvidia-modprobe`` with anything but ``-c N``/``-u`` (``-m`` only when nvidia_modeset is
  already loaded: otherwise nvidia-modprobe would load it);
- change a GPU setting: ``nvidia-smi`` with anything but its read-only queries (persistence
  ``-pm``, MIG ``-mig``/``mig -cgi``, clocks ``-ac``/``-lgc``, ``-pl``, ``-e``, ``-c``,
  ``-r``/``--gpu-reset``, ``drain`` … all refused: a whitelist, not a blacklist);
  nvidia-persistenced, nv-fabricmanager, nvidia-ctk, dcgmi;
- mount anything outside a private mount namespace of our own (``ALLOW_MOUNT`` is set only
  by the namespace helper after it checked its namespace is not the node's);
- write below /sys, /proc/sys, /proc/driver, /lib/modules, /etc/modprobe.d or the ld cache.

The same rules check the tier's own commands (``refusal``) and are unit-tested with no GPU
(tests/unit/test_gpu_tier.py). The before/after snapshot (tests/gpu/node.py ``snapshot``)
checks the result: /proc/modules, /proc/driver/nvidia/params, the node's /dev/nvidia* and
nvidia-smi's persistence/MIG/compute/clock/ECC/power state, unchanged at the end.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

ALLOW_MOUNT = False  # set only inside a private mount namespace of the tier's own
ENFORCE = True  # pytest turns it on for the tier's session only (the hook cannot be removed)
_INSTALLED = False

MODULE_TOOLS = {"rmmod", "insmod", "modprobe", "depmod", "modprobe.d", "kmod"}
GPU_SETTERS = {"nvidia-persistenced", "nv-fabricmanager", "nvidia-fabricmanager", "nvidia-ctk",
               "dcgmi", "nv-hostengine", "nvidia-xconfig", "nvidia-settings"}
NODE_CHANGERS = {"reboot", "shutdown", "poweroff", "halt", "kexec", "systemctl", "udevadm",
                 "update-initramfs", "dkms", "mokutil", "setpci", "sysctl"}
MOUNTERS = {"mount", "umount"}
WRAPPERS = {"setpriv", "timeout", "env", "nice", "ionice", "unshare", "nsenter", "chroot", "sudo",
            "capsh", "xargs", "stdbuf"}
# nvidia-smi's read-only forms: flags alone, flags taking a value, value prefixes.
SMI_FLAGS = {"-L", "--list-gpus", "-q", "--query", "-x", "--xml-format", "--version", "-h",
             "--help", "--help-query-gpu", "--help-query-compute-apps", "-B", "--list-excluded-gpus"}
SMI_VALUE_FLAGS = {"-i", "--id", "-d", "--display", "-f", "--filename"}
SMI_PREFIXES = ("--query-gpu=", "--query-compute-apps=", "--format=", "--id=", "--display=")
WRITE_ROOTS = ("/sys/", "/proc/sys/", "/proc/driver/", "/lib/modules/", "/usr/lib/modules/",
               "/etc/modprobe.d/", "/etc/ld.so.cache", "/etc/ld.so.conf")
_MODPROBE_OPT = re.compile(r"^-c\s*\d+$|^-u$|^-m$")


class Refused(RuntimeError):
    """A command or write the read-only GPU tier must never make."""


def modeset_loaded() -> bool:
    try:
        return any(line.split()[0] == "nvidia_modeset"
                   for line in Path("/proc/modules").read_text().splitlines() if line.strip())
    except OSError:
        return False


def _smi_refusal(args: list[str]) -> str | None:
    i = 0
    while i < len(args):
        a = args[i]
        if a in SMI_FLAGS or a.startswith(SMI_PREFIXES):
            i += 1
        elif a in SMI_VALUE_FLAGS:
            i += 2
        else:
            return f"nvidia-smi {a} is not one of its read-only queries"
    return None


def _modprobe_refusal(args: list[str], modeset: bool) -> str | None:
    if not args:
        return "nvidia-modprobe without -c loads the nvidia module"
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-c" and i + 1 < len(args) and args[i + 1].isdigit():
            i += 2
            continue
        if not _MODPROBE_OPT.match(a):
            return f"nvidia-modprobe {a}: only -c N, -u and -m (device files) are allowed"
        if a == "-m" and not modeset:
            return "nvidia-modprobe -m loads nvidia_modeset, which is not loaded on this node"
        i += 1
    if not any(a.startswith("-c") for a in args):
        return "nvidia-modprobe without -c loads a module"
    return None


def refusal(argv: list[str] | tuple[str, ...] | str, *, modeset: bool | None = None) -> str | None:
    """Why this command must not run in the read-only tier, or None."""
    if isinstance(argv, str):
        argv = ["sh", "-c", argv]
    argv = [os.fsdecode(a) for a in argv]
    if not argv:
        return None
    prog = Path(argv[0]).name
    args = argv[1:]
    if prog in ("sh", "bash", "dash") and "-c" in args:
        script = args[args.index("-c") + 1] if args.index("-c") + 1 < len(args) else ""
        try:
            lex = shlex.shlex(script, posix=True, punctuation_chars=True)
            lex.whitespace_split = True
            words = list(lex)
        except ValueError:
            return f"unparsable shell script: {script[:80]!r}"
        # Every word that could be a command (the first, and each after ; && || |).
        cmds, cur = [], []
        for w in words:
            if w and set(w) <= set(";&|()\n"):
                cmds.append(cur)
                cur = []
            else:
                cur.append(w)
        cmds.append(cur)
        for cmd in cmds:
            why = refusal(cmd, modeset=modeset) if cmd else None
            if why:
                return why
        return None
    if prog in WRAPPERS:
        # The wrapped command: refuse if any suffix that starts with a word could be one.
        for k, a in enumerate(args):
            if not a.startswith("-"):
                why = refusal(args[k:], modeset=modeset)
                if why:
                    return why
        return None
    if prog in MODULE_TOOLS or prog.startswith("modprobe"):
        if prog == "kmod" and args[:1] == ["list"]:
            return None
        return f"{prog} loads or unloads kernel modules"
    if prog == "lsmod" or prog == "modinfo":
        return None
    if prog == "nvidia-smi":
        return _smi_refusal(args)
    if prog == "nvidia-modprobe":
        return _modprobe_refusal(args, modeset_loaded() if modeset is None else modeset)
    if prog in GPU_SETTERS:
        return f"{prog} changes GPU or fabric state"
    if prog in NODE_CHANGERS:
        return f"{prog} changes the node"
    if prog == "ldconfig" and "-p" not in args and "--print-cache" not in args:
        return "ldconfig without -p rewrites the ld cache"
    if prog in MOUNTERS and not ALLOW_MOUNT:
        return f"{prog} outside the tier's own private mount namespace"
    return None


def write_refusal(path: str, mode: object, flags: object) -> str | None:
    writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
        isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))
    if not writing:
        return None
    p = os.path.abspath(path)
    if p.startswith(WRITE_ROOTS) or p in ("/etc/ld.so.cache",):
        return f"writing {p}"
    return None


def _hook(event: str, args: tuple) -> None:
    if not ENFORCE:
        return
    why = None
    if event == "subprocess.Popen":
        why = refusal(list(args[1]) if not isinstance(args[1], (str, bytes)) else
                      os.fsdecode(args[1]))
    elif event in ("os.exec", "os.posix_spawn"):
        why = refusal(list(args[1]))
    elif event == "os.system":
        why = refusal(os.fsdecode(args[0]))
    elif event == "open" and isinstance(args[0], (str, bytes)):
        why = write_refusal(os.fsdecode(args[0]), args[1], args[2])
    if why:
        raise Refused(f"the read-only GPU tier refused: {why}")


def install() -> None:
    """Install the hook in this process (once; audit hooks cannot be removed)."""
    global _INSTALLED
    if not _INSTALLED:
        sys.addaudithook(_hook)
        _INSTALLED = True
