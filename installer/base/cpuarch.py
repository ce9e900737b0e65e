"""The node's CPU architecture and every name that depends on it. Pure.

Read once per run from the node (``KernelState.machine``: the kernel's own
``/proc/sys/kernel/arch``, else ``uname -m``) and carried in the ``Context``; nothing
else asks. Not the kernel release's suffix: COS's ``6.6.68+`` and Ubuntu's ``-gcp`` name
no architecture, and Debian's ``-cloud-amd64``/``-cloud-arm64`` would be a second source.

The names, each from the project that publishes the thing:

- the .run: ``NVIDIA-Linux-<x86_64|aarch64>-<V>.run`` (NVIDIA/gpu-driver-container
  ubuntu22.04/install.sh ``download_installer``: ``DRIVER_ARCH=${TARGETARCH/amd64/x86_64}
  && DRIVER_ARCH=${DRIVER_ARCH/arm64/aarch64}``, then ``$BASE_URL/$DRIVER_VERSION/
  NVIDIA-Linux-$DRIVER_ARCH-$DRIVER_VERSION.run``: one directory per version, both
  architectures in it);
- NVIDIA's compute redistributables (the fabric manager): ``linux-x86_64`` and
  ``linux-sbsa`` (gpu-driver-container rhel9/Dockerfile: ``OS_ARCH=${OS_ARCH/arm64/sbsa}``
  for NVIDIA's compute repositories; the redist tree uses the same platform names);
- Debian's multiarch triplet (where nvidia-installer puts libraries: /usr/lib/<triplet>)
  and dpkg architecture (``amd64``/``arm64``: linux-headers-*-arm64);
- Kbuild's ``ARCH`` (``x86``/``arm64``: the kernel's arch/ directory names) and the
  cross compiler prefix Debian's ``gcc-aarch64-linux-gnu`` installs.
"""

from __future__ import annotations

from installer.base.dataclass import dataclass
from installer.base.errors import UnsupportedHostError, clip


@dataclass(frozen=True)
class CpuArch:
    machine: str  # uname -m
    nvidia: str  # the .run's name: NVIDIA-Linux-<nvidia>-<V>.run
    redist: str  # NVIDIA's redistributable platform: fabricmanager/<redist>/
    triplet: str  # Debian multiarch: /usr/lib/<triplet>
    debian: str  # dpkg --print-architecture
    kbuild: str  # make ARCH=<kbuild>
    cross_prefix: str  # make CROSS_COMPILE=<prefix> from another architecture

    def __str__(self) -> str:
        return self.machine


X86_64 = CpuArch("x86_64", "x86_64", "linux-x86_64", "x86_64-linux-gnu", "amd64", "x86",
                 "x86_64-linux-gnu-")
AARCH64 = CpuArch("aarch64", "aarch64", "linux-sbsa", "aarch64-linux-gnu", "arm64", "arm64",
                  "aarch64-linux-gnu-")
ARCHES = (X86_64, AARCH64)


def from_machine(machine: str) -> CpuArch:
    """The architecture ``uname -m`` names; UnsupportedHostError for any other (NVIDIA
    ships data-centre drivers for these two only)."""
    for arch in ARCHES:
        if machine.strip() == arch.machine:
            return arch
    raise UnsupportedHostError(
        f"the node's CPU architecture {clip(machine)!r} (uname -m) has no NVIDIA "
        "data-centre driver: x86_64 and aarch64 do",
        hint="run the installer on an x86_64 or aarch64 (Grace) node", machine=clip(machine))


def from_name(name: str) -> CpuArch:
    """``--arch``'s value: ``uname -m`` or dpkg spelling (``aarch64``/``arm64``)."""
    for arch in ARCHES:
        if name in (arch.machine, arch.debian):
            return arch
    raise ValueError(f"{name!r} is not an architecture the installer knows: "
                     + ", ".join(f"{a.machine} ({a.debian})" for a in ARCHES))


# ELF e_machine (linux include/uapi/linux/elf-em.h: EM_X86_64 62, EM_AARCH64 183), at
# offset 18 of the header, little-endian on both (EI_DATA = ELFDATA2LSB).
ELF_MACHINES = {62: X86_64, 183: AARCH64}
ELF_HEAD_BYTES = 64


def elf_arch(head: bytes) -> CpuArch | None:
    """The architecture of an ELF file from its first bytes; None for a script, another
    format or a machine the installer does not know."""
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[5] != 1:
        return None
    return ELF_MACHINES.get(int.from_bytes(head[18:20], "little"))


def binfmt_runs(entry: str, head: bytes) -> bool:
    """Whether one ``/proc/sys/fs/binfmt_misc/<name>`` entry (qemu-user-static's
    ``qemu-aarch64``) hands a file starting with ``head`` to its interpreter: the kernel's
    own test (fs/binfmt_misc.c ``check_file``: enabled, and for a magic entry every byte
    from ``offset`` equal to ``magic`` under ``mask``). Extension entries never match an
    ELF binary; an unreadable entry matches nothing."""
    fields: dict[str, str] = {}
    for line in entry.splitlines():
        key, _, value = line.strip().partition(" ")
        fields[key] = value.strip()
    if "enabled" not in fields or "magic" not in fields:
        return False
    try:
        magic = bytes.fromhex(fields["magic"])
        mask = bytes.fromhex(fields["mask"]) if "mask" in fields else b"\xff" * len(magic)
        offset = int(fields.get("offset", "0"))
    except ValueError:
        return False
    window = head[offset:offset + len(magic)]
    return len(window) == len(magic) and len(mask) == len(magic) and all(
        (b ^ m) & k == 0 for b, m, k in zip(window, magic, mask, strict=True))
