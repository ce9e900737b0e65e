"""What the running kernel says: loaded modules, command line (signing: ``signing``).

All reads go through ``KernelState`` so that tests (and the chroot fixture) can
point it at a fake procfs/sysfs with NVIDIA_INSTALLER_PROC_DIR / _SYS_DIR /
_DEV_DIR. Parsers are pure functions over text.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LoadedModule:
    name: str
    size: int
    refcnt: int
    used_by: tuple[str, ...]


def parse_proc_modules(text: str) -> dict[str, LoadedModule]:
    """Parse /proc/modules: ``name size refcnt used_by state address [taint]``."""
    modules: dict[str, LoadedModule] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        name, size, refcnt, used_by = fields[:4]
        users = tuple(u for u in used_by.split(",") if u and u != "-")
        try:
            modules[name] = LoadedModule(name, int(size), int(refcnt), users)
        except ValueError:
            continue
    return modules


def module_name(file_or_name: str) -> str:
    """Kernel module name of ``nvidia-uvm.ko`` / ``nvidia-uvm``: ``nvidia_uvm``."""
    base = file_or_name.rsplit("/", 1)[-1]
    if base.endswith(".ko"):
        base = base[:-3]
    return base.replace("-", "_")


class KernelState:
    def __init__(
        self,
        proc_dir: Path | None = None,
        sys_dir: Path | None = None,
        dev_dir: Path | None = None,
    ) -> None:
        env = os.environ
        self.proc_dir = Path(proc_dir or env.get("NVIDIA_INSTALLER_PROC_DIR") or "/proc")
        self.sys_dir = Path(sys_dir or env.get("NVIDIA_INSTALLER_SYS_DIR") or "/sys")
        self.dev_dir = Path(dev_dir or env.get("NVIDIA_INSTALLER_DEV_DIR") or "/dev")

    def seam_env(self) -> dict[str, str]:
        """Env for child processes so fakes and real tools see the same kernel."""
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

    def modules(self) -> dict[str, LoadedModule]:
        return parse_proc_modules(self._read(self.proc_dir / "modules") or "")

    def module_present(self, name: str) -> bool:
        """Loaded as a module or built in (both show up in /sys/module)."""
        return (self.sys_dir / "module" / name).is_dir() or name in self.modules()

    def module_version(self, name: str) -> str | None:
        text = self._read(self.sys_dir / "module" / name / "version")
        return text.strip() if text else None

    def cmdline(self) -> str:
        return (self._read(self.proc_dir / "cmdline") or "").strip()

    def device_node(self, name: str) -> Path:
        return self.dev_dir / name
