"""What the running kernel says: loaded modules, command line (signing: ``signing``).

All reads go through ``KernelState``, which reads ``/proc``, ``/sys`` and ``/dev``. No
option or env var of the installed CLI points it anywhere else: the CLI runs privileged,
and a kernel state it could be told to read elsewhere is one it could be lied to about.
Tests reach their fake kernel through ``use_roots``, called in-process by the test
harness's start-up hook (tests/fixtures/kernelhook). Parsers are pure functions over text.
"""

from __future__ import annotations

import os
from pathlib import Path

from installer.base.dataclass import dataclass


@dataclass(frozen=True)
class LoadedModule:
    """One line of /proc/modules. ``refcnt`` is None where the kernel has no
    ``CONFIG_MODULE_UNLOAD``: it prints ``-`` for the count and the users (torvalds/linux
    kernel/module/procfs.c ``print_unload_info``), keeps no refcount and cannot unload."""

    name: str
    size: int
    refcnt: int | None
    used_by: tuple[str, ...]
    state: str = "Live"  # Live, Loading, Unloading (procfs.c m_show)
    permanent: bool = False  # "[permanent]," in the users column: no exit function


def parse_proc_modules(text: str) -> dict[str, LoadedModule]:
    """Parse /proc/modules: ``name size refcnt used_by state address [taint]``, every form
    procfs.c ``m_show``/``print_unload_info`` prints: ``nvidia 1 2 nvidia_uvm, Live …``,
    ``nvidia 1 0 - Live …``, ``x 1 0 [permanent], Live …`` and, without module unload
    support, ``nvidia_uvm 1830912 - - Live 0xffffffffc080c000 (O)`` (a real H100 node:
    tests/data/gpu-node)."""
    modules: dict[str, LoadedModule] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        name, size, refcnt, used_by, state = fields[:5]
        if not size.isdigit() or not (refcnt.isdigit() or refcnt == "-"):
            continue
        users = tuple(u for u in used_by.split(",") if u and u not in ("-", "[permanent]"))
        modules[name] = LoadedModule(name, int(size), int(refcnt) if refcnt != "-" else None,
                                     users, state, "[permanent]" in used_by)
    return modules


def module_name(file_or_name: str) -> str:
    """Kernel module name of ``nvidia-uvm.ko`` / ``nvidia-uvm``: ``nvidia_uvm``."""
    base = file_or_name.rsplit("/", 1)[-1]
    if base.endswith(".ko"):
        base = base[:-3]
    return base.replace("-", "_")


@dataclass(frozen=True)
class KernelRoots:
    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    dev: Path = Path("/dev")


_roots = KernelRoots()


def use_roots(roots: KernelRoots) -> None:
    """Point every ``KernelState`` made from now on at ``roots``: for test harnesses only."""
    global _roots
    _roots = roots


class KernelState:
    def __init__(
        self,
        proc_dir: Path | None = None,
        sys_dir: Path | None = None,
        dev_dir: Path | None = None,
    ) -> None:
        self.proc_dir = Path(proc_dir or _roots.proc)
        self.sys_dir = Path(sys_dir or _roots.sys)
        self.dev_dir = Path(dev_dir or _roots.dev)

    def seam_env(self) -> dict[str, str]:
        """Env for child processes so a test's stand-ins see the same fake kernel (empty
        on a real node: the names are the test fixture's, tests/fixtures/kernel.py)."""
        env = {}
        for key, value, default in (
            ("NVIDIA_INSTALLER_PROC_DIR", self.proc_dir, "/proc"),
            ("NVIDIA_INSTALLER_SYS_DIR", self.sys_dir, "/sys"),
            ("NVIDIA_INSTALLER_DEV_DIR", self.dev_dir, "/dev"),
        ):
            if str(value) != default:
                env[key] = str(value)
        return env

    def _read(self, path: Path) -> str | None:
        try:
            return path.read_text(errors="replace")
        except OSError:
            return None

    def release(self) -> str:
        text = self._read(self.proc_dir / "sys/kernel/osrelease")
        return text.strip() if text else os.uname().release

    def machine(self) -> str:
        """``uname -m``: the kernel's ``/proc/sys/kernel/arch`` (init_uts_ns.name.machine,
        torvalds/linux kernel/utsname_sysctl.c ``uts_kern_table``, since 6.1), else this
        process's uname, which is the node's: every UTS namespace copies the machine field."""
        text = self._read(self.proc_dir / "sys/kernel/arch")
        return text.strip() if text and text.strip() else os.uname().machine

    def modules(self) -> dict[str, LoadedModule]:
        return parse_proc_modules(self._read(self.proc_dir / "modules") or "")

    def is_loaded(self, name: str) -> bool:
        """Loaded as a module (not built in): ``/sys/module/<m>/initstate`` exists for
        loadable modules only (kernel/module/sysfs.c ``modinfo_initstate``), whatever
        /proc/modules prints; /proc/modules where sysfs is not mounted."""
        state = self._read(self.sys_dir / "module" / name / "initstate")
        if state is not None:
            return state.strip() in ("live", "coming")
        return name in self.modules()

    def module_present(self, name: str) -> bool:
        """Loaded as a module or built in (both show up in /sys/module)."""
        return (self.sys_dir / "module" / name).is_dir() or name in self.modules()

    def modules_disabled(self) -> bool:
        """``kernel.modules_disabled=1``: init_module, finit_module and delete_module are
        EPERM until reboot (kernel/module/main.c ``may_init_module``; proc(5))."""
        return (self._read(self.proc_dir / "sys/kernel/modules_disabled") or "0").strip() == "1"

    def can_unload(self) -> bool:
        """False on a kernel built without ``CONFIG_MODULE_UNLOAD`` (no delete_module(2):
        ENOSYS), told by the ``-`` refcount /proc/modules prints for every module there
        (procfs.c ``print_unload_info``); True when nothing is loaded to tell by."""
        loaded = list(self.modules().values())
        return not loaded or any(m.refcnt is not None for m in loaded)

    def module_version(self, name: str) -> str | None:
        text = self._read(self.sys_dir / "module" / name / "version")
        return text.strip() if text else None

    def cmdline(self) -> str:
        return (self._read(self.proc_dir / "cmdline") or "").strip()

    def device_node(self, name: str) -> Path:
        return self.dev_dir / name
