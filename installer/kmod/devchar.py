"""``/dev/char/<major>:<minor>`` symlinks for the NVIDIA device nodes.

runc's systemd cgroup driver re-applies a container's device rules after a
``systemctl daemon-reload`` by path ``/dev/char/<major>:<minor>``. The kernel's
devtmpfs creates those links for devices it knows, but NVIDIA's nodes are made
by ``nvidia-modprobe`` with mknod, so the links are missing, the rules are
dropped and running GPU containers lose access: "Failed to initialize NVML:
Unknown Error". This is what ``nvidia-ctk system create-dev-char-symlinks``
does: a relative link (``../nvidia0``, as udev makes them) for every NVIDIA
character device, including ``nvidia-caps/*``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import structlog

from installer.base.dataclass import dataclass

log = structlog.get_logger(__name__)

CAPS_DIR = "nvidia-caps"


@dataclass(frozen=True)
class CharDevice:
    rel: str  # path under the dev dir: nvidia0, nvidia-caps/nvidia-cap1
    major: int
    minor: int
    mode: int  # permission bits

    @property
    def link_name(self) -> str:
        return f"{self.major}:{self.minor}"

    @property
    def link_target(self) -> str:
        return f"../{self.rel}"


def nvidia_char_devices(dev_dir: Path) -> list[CharDevice]:
    """Character devices named nvidia* in the dev dir and in nvidia-caps/."""
    found = []
    candidates = sorted(dev_dir.glob("nvidia*")) + sorted((dev_dir / CAPS_DIR).glob("*"))
    for path in candidates:
        try:
            st = path.lstat()
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            found.append(CharDevice(path.relative_to(dev_dir).as_posix(), os.major(st.st_rdev),
                                    os.minor(st.st_rdev), stat.S_IMODE(st.st_mode)))
    return found


@dataclass(frozen=True)
class LinkState:
    device: CharDevice
    link: Path
    problem: str | None  # None: present and right


def check(dev_dir: Path) -> list[LinkState]:
    """Each NVIDIA char device and whether its /dev/char link is right."""
    out = []
    for dev in nvidia_char_devices(dev_dir):
        link = dev_dir / "char" / dev.link_name
        if link.is_symlink():
            target = os.readlink(link)
            resolved = (link.parent / target).resolve() if not os.path.isabs(target) else None
            if target == dev.link_target or resolved == (dev_dir / dev.rel).resolve():
                out.append(LinkState(dev, link, None))
            elif os.path.isabs(target) and Path(target).name == Path(dev.rel).name:
                out.append(LinkState(dev, link, None))  # /dev/nvidia0 from nvidia-ctk: fine
            else:
                out.append(LinkState(dev, link, f"points to {target}"))
        elif link.exists():
            out.append(LinkState(dev, link, "is not a symlink"))
        else:
            out.append(LinkState(dev, link, "missing"))
    return out


def create(dev_dir: Path) -> list[str]:
    """Create or fix the links; returns the ``major:minor`` names changed. Idempotent."""
    char_dir = dev_dir / "char"
    char_dir.mkdir(exist_ok=True)
    changed = []
    for state in check(dev_dir):
        if state.problem is None:
            continue
        tmp = char_dir / f".{state.device.link_name}.tmp"
        tmp.unlink(missing_ok=True)
        os.symlink(state.device.link_target, tmp)
        os.replace(tmp, state.link)  # atomic: the old link is never briefly absent
        changed.append(state.device.link_name)
    log.info("dev_char_symlinks_ready", created=changed,
             devices=[d.rel for d in nvidia_char_devices(dev_dir)])
    return changed


def nvidia_links(dev_dir: Path) -> list[Path]:
    """The /dev/char links that point at NVIDIA nodes (what ``remove`` removes)."""
    char_dir = dev_dir / "char"
    if not char_dir.is_dir():
        return []
    links = []
    for link in sorted(char_dir.iterdir()):
        if not link.is_symlink():
            continue
        rel = Path(os.readlink(link))
        if rel.name.startswith("nvidia") or CAPS_DIR in rel.parts:
            links.append(link)
    return links


def remove(dev_dir: Path) -> list[str]:
    """Remove /dev/char links that point at NVIDIA nodes (uninstall)."""
    removed = []
    for link in nvidia_links(dev_dir):
        link.unlink()
        removed.append(link.name)
    return removed


def remove_nodes(dev_dir: Path) -> list[str]:
    """Remove the NVIDIA device nodes (stale once the modules are gone): uninstall."""
    removed = []
    for dev in nvidia_char_devices(dev_dir):
        (dev_dir / dev.rel).unlink(missing_ok=True)
        removed.append(dev.rel)
    caps = dev_dir / CAPS_DIR
    if caps.is_dir() and not any(caps.iterdir()):
        caps.rmdir()
    return removed
