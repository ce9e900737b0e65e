"""Read ``.modinfo`` of a kernel module file (vermagic, depends, version).

Modules are ELF objects whose ``.modinfo`` section holds NUL-separated
``key=value`` strings (NUL padding between them is skipped, as the kernel does).
"""

from __future__ import annotations

import struct
from pathlib import Path


def _parse_strings(blob: bytes) -> dict[str, str]:
    info: dict[str, str] = {}
    for item in blob.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq and key and key.replace(b"_", b"").replace(b".", b"").isalnum():
            info.setdefault(key.decode(errors="replace"), value.decode(errors="replace"))
    return info


def read_modinfo(path: Path) -> dict[str, str]:
    """Return the module's modinfo keys, or {} if the file is not a module."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only
            return {}
        endian = "<" if head[5] == 1 else ">"
        shoff, = struct.unpack_from(endian + "Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from(endian + "HHH", head, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        sections = [
            struct.unpack_from(endian + "IIQQQQ", table, i * shentsize)[:6] for i in range(shnum)
        ]
        # (name, type, flags, addr, offset, size)
        _, _, _, _, str_off, str_size = sections[shstrndx]
        f.seek(str_off)
        names = f.read(str_size)
        for name_off, _type, _flags, _addr, offset, size in sections:
            end = names.find(b"\0", name_off)
            if names[name_off:end] == b".modinfo":
                f.seek(offset)
                return _parse_strings(f.read(size))
    return {}


def module_depends(info: dict[str, str]) -> list[str]:
    return [d.replace("-", "_") for d in info.get("depends", "").split(",") if d]


def vermagic_release(info: dict[str, str]) -> str | None:
    magic = info.get("vermagic", "").split()
    return magic[0] if magic else None
