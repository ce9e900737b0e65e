"""The NVIDIA device files, made the way NVIDIA's own nvidia-modprobe makes them.

The kernel modules make none (they register character regions, no
``device_create``); NVIDIA's user space makes them: NVML (``nvidia-smi`` as root)
``/dev/nvidiactl`` and ``/dev/nvidiaN``, ``nvidia-modprobe`` any of them on request.
We ask ``nvidia-modprobe`` for every file explicitly rather than rely on NVML's side
effect, so the result is the same whoever runs first. What each option means is
NVIDIA/nvidia-modprobe ``nvidia-modprobe.c`` ``main()`` (the same from 535.43.02, the
first release that also links ``/dev/char/<major>:<minor>``, to 550 and later):

- without ``-u``, every ``-c N`` is ``nvidia_mknod(N)``: ``/dev/nvidiaN`` (195, N), and
  ``/dev/nvidiactl`` (195, 255) for N = 255 (``assign_device_file_name``);
- ``-m`` is ``nvidia_modeset_mknod()``: ``/dev/nvidia-modeset`` (195, 254);
- with ``-u``, every ``-c N`` is ``nvidia_uvm_mknod(N)``: ``/dev/nvidia-uvm`` (major of
  "nvidia-uvm" in /proc/devices, minor N) and ``/dev/nvidia-uvm-tools`` (N + 1). Only
  ``-c0`` is right: ``-c0 -c1 -u`` leaves nvidia-uvm at minor 1.

We ask only for the files of the modules that are loaded: nvidia-modprobe loads a module
it is asked about and is not loaded (``modprobe_helper``), and fails when it cannot (a real
H100 node with only nvidia and nvidia_uvm loaded, ``kernel.modules_disabled=1``: ``-m``
exits 1). ``nvidia`` -> ``nvidiactl``, ``nvidiaN``; ``nvidia_uvm`` -> ``nvidia-uvm``,
``nvidia-uvm-tools``; ``nvidia_modeset`` -> ``nvidia-modeset``.

With ``NVreg_ModifyDeviceFiles=0`` the driver leaves device files to the admin
(``mknod_helper`` only links existing ones); we make none either and only check them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import structlog

from installer.base.dataclass import dataclass
from installer.base.errors import VerifyError
from installer.host import gpus
from installer.host.runner import CommandError, Runner
from installer.kmod import devchar, modules
from installer.kmod.kernel import KernelState
from installer.kmod.moduleargs import ModuleArg, for_module

log = structlog.get_logger(__name__)

TIMEOUT_S = 120
CTL_MINOR = 255  # NV_CTL_DEVICE_NUM (nvidia-modprobe-utils.h)
UVM_NODES = ("nvidia-uvm", "nvidia-uvm-tools")


def parse_device_minor(text: str) -> int | None:
    """The ``Device Minor:`` line of /proc/driver/nvidia/gpus/<addr>/information."""
    m = re.search(r"^Device Minor:\s*(\d+)\s*$", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def parse_params(text: str) -> dict[str, int]:
    """/proc/driver/nvidia/params: ``Name: value`` lines (numeric ones only)."""
    out = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and value.strip().isdigit():
            out[name.strip()] = int(value)
    return out


def modify_allowed(params_text: str | None, module_args: tuple[ModuleArg, ...]) -> bool:
    """ModifyDeviceFiles as the loaded driver reports it, else as we would load it (default 1)."""
    if params_text is not None:
        return parse_params(params_text).get("ModifyDeviceFiles", 1) == 1
    for arg in for_module("nvidia", module_args):
        if arg.param == "NVreg_ModifyDeviceFiles":
            return arg.value == "1"
    return True


# The modules whose device files nvidia-modprobe makes, in the order it is asked.
NODE_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset")
DATACENTER = modules.REQUIRED_MODULES  # what a node gets by default


def modprobe_invocations(minors: list[int],
                         loaded: tuple[str, ...] = DATACENTER) -> list[list[str]]:
    """nvidia-modprobe's argv lists (after the program) for these GPU minors, asking only
    for the files of the ``loaded`` modules (anything else it would try to load)."""
    calls = []
    if "nvidia" in loaded:
        # No -u: each -c is nvidia_mknod(); 255 is nvidiactl; -m nvidia_modeset_mknod().
        calls.append([f"-c{CTL_MINOR}", *(f"-c{m}" for m in minors),
                      *(["-m"] if "nvidia_modeset" in loaded else [])])
    if "nvidia_uvm" in loaded:
        # -u: -c0 is the UVM base minor, nvidia-uvm 0 and nvidia-uvm-tools 1 (nvidia_uvm_mknod).
        calls.append(["-c0", "-u"])
    return calls


def expected_nodes(minors: list[int], loaded: tuple[str, ...] = DATACENTER) -> list[str]:
    """The device files of the ``loaded`` modules."""
    nodes = ["nvidiactl", *(f"nvidia{m}" for m in minors)] if "nvidia" in loaded else []
    if "nvidia_modeset" in loaded:
        nodes.append("nvidia-modeset")
    return nodes + (list(UVM_NODES) if "nvidia_uvm" in loaded else [])


def missing_nodes(kernel: KernelState) -> list[str]:
    """The device files a working driver has that are missing here (or are not character
    devices): nvidiactl, nvidia<minor> per GPU and the uvm ones, which CUDA opens, and
    nvidia-modeset while its module is loaded. One answer for `verify` and `doctor`."""
    loaded = loaded_modules(kernel)
    wanted = expected_nodes(gpu_minors(kernel), tuple(dict.fromkeys((*DATACENTER, *loaded))))
    present = {d.rel for d in devchar.nvidia_char_devices(kernel.dev_dir)}
    return [w for w in wanted if w not in present]


def loaded_modules(kernel: KernelState) -> tuple[str, ...]:
    """Which of NODE_MODULES are loaded (/sys/module/<m>/initstate)."""
    return tuple(m for m in NODE_MODULES if kernel.is_loaded(m))


@dataclass(frozen=True)
class Plan:
    minors: list[int]
    modify: bool
    modules: tuple[str, ...] = DATACENTER  # the loaded ones whose files are made

    @property
    def invocations(self) -> list[list[str]]:
        return modprobe_invocations(self.minors, self.modules) if self.modify else []

    @property
    def nodes(self) -> list[str]:
        return expected_nodes(self.minors, self.modules)

    def describe(self) -> str:
        if not self.modify:
            return ("NVreg_ModifyDeviceFiles=0: no device files made, those present are "
                    "checked and linked in /dev/char")
        calls = "; ".join("nvidia-modprobe " + " ".join(a) for a in self.invocations)
        return f"{calls}; /dev/char/<major>:<minor> links"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def driver_minors(kernel: KernelState) -> tuple[int, ...] | None:
    """The loaded driver's minors (/proc/driver/nvidia/gpus/*/information; None: no GPU
    there, or one whose minor it does not say)."""
    infos = sorted((kernel.proc_dir / "driver/nvidia/gpus").glob("*/information"))
    found = [parse_device_minor(_read(p) or "") for p in infos]
    if found and None not in found:
        return tuple(sorted(m for m in found if m is not None))
    return None


def read_params(kernel: KernelState) -> str | None:
    """/proc/driver/nvidia/params (None: no driver loaded)."""
    return _read(kernel.proc_dir / "driver/nvidia/params")


def gpu_minors(kernel: KernelState, on_bus: int | None = None) -> list[int]:
    """The driver's minors (/proc/driver/nvidia/gpus/*/information), else 0..N-1 for the
    GPUs on the PCI bus (``on_bus``: how many a caller already found; None: scanned)."""
    found = driver_minors(kernel)
    if found is not None:
        return list(found)
    count = len(gpus.scan(kernel.sys_dir)) if on_bus is None else on_bus
    return list(range(max(1, count)))


def plan(kernel: KernelState, module_args: tuple[ModuleArg, ...],
         loaded: tuple[str, ...] | None = None, *, on_bus: int | None = None) -> Plan:
    """``loaded``: the modules whose files to make (None: those loaded now); ``on_bus``:
    see gpu_minors."""
    loaded = loaded_modules(kernel) if loaded is None else tuple(
        m for m in NODE_MODULES if m in loaded)
    return Plan(gpu_minors(kernel, on_bus), modify_allowed(read_params(kernel), module_args),
                loaded)


def planned(params: str | None, minors: tuple[int, ...] | None, on_bus: int,
            module_args: tuple[ModuleArg, ...], loads: tuple[str, ...]) -> Plan:
    """As ``plan``, from what a probe read (context.NodeProbe): no kernel read."""
    numbers = list(minors) if minors is not None else list(range(max(1, on_bus)))
    return Plan(numbers, modify_allowed(params, module_args),
                tuple(m for m in NODE_MODULES if m in loads))


def create(modprobe: Path, kernel: KernelState, runner: Runner,
           module_args: tuple[ModuleArg, ...], *, on_bus: int | None = None) -> list[str]:
    """Make the device files of the loaded modules (unless the driver forbids it), check
    they all exist and link them in /dev/char."""
    p = plan(kernel, module_args, on_bus=on_bus)
    dev = kernel.dev_dir
    if "nvidia" not in p.modules:
        raise VerifyError("cannot create the NVIDIA device files: the nvidia module is not "
                          "loaded", hint="load the driver first (re-run install); check "
                          "dmesg for why it is gone", path=str(dev))
    if p.modify:
        if not os.access(dev, os.W_OK):
            raise VerifyError(f"cannot create the NVIDIA device files: {dev} is not writable",
                              hint="mount the host's /dev read-write into the container "
                              "(privileged)", path=str(dev))
        # nvidia-modprobe's symlink_char_dev fails the whole call when /dev/char is missing
        # (devtmpfs has it; Debian's 535.309.01 exits 1 in an empty tmpfs /dev).
        _make_char_dir(dev)
        loaded = ", ".join(p.modules)
        for argv in p.invocations:
            try:
                runner.run([modprobe, *argv], timeout=TIMEOUT_S)
            except CommandError as exc:
                raise VerifyError(  # exc.reason: "exited with N" or "timed out after Ns"
                    f"nvidia-modprobe {' '.join(argv)} {exc.reason}"
                    f"{': ' + exc.stderr_tail(2) if exc.stderr_tail(2) else ''}",
                    hint=f"it was asked only for the files of the loaded modules ({loaded}): "
                    "check they are still loaded (/proc/modules, /proc/devices) and /dev is "
                    "the host's, mounted read-write",
                    path=str(modprobe)) from exc
    missing = [n for n in p.nodes if not (dev / n).exists()]
    if missing:
        what = ", ".join(f"/dev/{n}" for n in missing)
        if not p.modify:
            raise VerifyError(f"NVreg_ModifyDeviceFiles=0 and {what} missing: the driver "
                              "leaves device files to you", path=str(dev),
                              hint="create them (udev rule or mknod, see /proc/devices) or "
                              "drop NVreg_ModifyDeviceFiles=0 from the module parameters")
        raise VerifyError(f"device files missing after nvidia-modprobe: {what}", path=str(dev),
                          hint="check /dev is the host's /dev, mounted read-write")
    _link_char_devices(dev)
    log.info("device_nodes_ready", nodes=p.nodes, modules=list(p.modules),
             made_by="nvidia-modprobe" if p.modify else None)
    return p.nodes


def _make_char_dir(dev: Path) -> None:
    try:
        (dev / "char").mkdir(exist_ok=True)
    except OSError as exc:
        raise VerifyError(f"cannot create {dev / 'char'}: {exc.strerror or exc}",
                          hint="the container needs the host's /dev mounted read-write",
                          path=str(dev / "char")) from exc


def link_char_devices(dev: Path) -> list[str]:
    """/dev/char links for every NVIDIA device file there now (e.g. the nvidia-caps files
    NVML makes during verify); the names changed."""
    return _link_char_devices(dev)


def _link_char_devices(dev: Path) -> list[str]:
    """/dev/char/<major>:<minor> for every NVIDIA node (nvidia-modprobe's own links do not
    cover nodes it did not make): without them GPU containers lose access after a
    systemctl daemon-reload ("Failed to initialize NVML: Unknown Error")."""
    try:
        return devchar.create(dev)
    except OSError as exc:
        raise VerifyError(
            f"could not create the /dev/char symlinks: {exc}",
            hint="the container needs the host's /dev mounted read-write",
            path=str(dev / "char"),
        ) from exc
