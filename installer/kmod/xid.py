"""The kernel log's records, and its NVIDIA Xid and GSP error lines: which mean "reset or
reboot", and which came since the current driver load.

The driver reports GPU faults as ``NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the
bus.`` (open-gpu-kernel-modules src/nvidia/src/kernel/gpu/rc/kernel_rc.c: ``"NVRM: Xid ("
attr "): %d, %s%s\\n"``); Xid 154 says the recovery the driver wants in words (``GPU
recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)``). Which codes need a
GPU reset or a node reboot follows the "Resolution Bucket (Immediate Action)" column of
NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html):
RESET_GPU and RESTART_BM.

Only the kernel's own records count, and only a message that *starts* with ``NVRM:``: any
user can put text into the kernel log (a write to /dev/kmsg is logged with facility LOG_USER,
never LOG_KERN: Documentation/ABI/testing/dev-kmsg), and an unprivileged user in a user
namespace can make the kernel itself quote text of theirs (``tmpfs: Unknown parameter
'NVRM: Xid ...'``), which is a kernel record that does not start with ``NVRM:``.

The log is read bounded: ``/dev/kmsg`` without blocking (one record per read, EAGAIN at the
end), at most MAX_BYTES bytes and DEADLINE_S seconds, keeping the newest MAX_RECORDS records.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections import deque
from pathlib import Path

from installer.base.dataclass import dataclass

MAX_RECORDS = 50_000
MAX_BYTES = 8 << 20
DEADLINE_S = 3.0
LOG_KERN = 0  # the syslog facility of the kernel's own messages (<sys/syslog.h>)

# Xid -> what it is; each needs a GPU reset, 79 a reboot (the GPU is gone from the bus).
NEEDS_RESET = {
    48: "double-bit ECC error",
    63: "ECC row remapping or page retirement pending",
    64: "ECC row remapping or page retirement failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
REBOOT = frozenset({79})
NVRM = "NVRM: "
_XID = re.compile(r"NVRM: Xid \((?P<where>[^)]*)\): (?P<code>\d+),? ?(?P<text>.*)")
_GSP = re.compile(r"NVRM: .*GSP.*(timeout|timed out|error|fail)", re.IGNORECASE)
# nvidia.ko's init prints this once it has found its GPUs, before it registers its devices
# (open-gpu-kernel-modules kernel-open/nvidia/nv.c, nvidia_init_module:
# ``nv_printf(NV_DBG_ERRORS, "NVRM: loading %s\n", pNVRM_ID)``; on the H100 node:
# ``NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build``).
LOAD_BANNER = "NVRM: loading NVIDIA UNIX "
# /dev/kmsg: ``prio,seq,usec,flags[,more];message`` (Documentation/ABI/testing/dev-kmsg).
_KMSG = re.compile(r"(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<message>.*)", re.S)
# util-linux ``dmesg --raw``: ``<prio>[%5ld.%06ld] message`` (dmesg.c print_record,
# LOG_RAW_FAC_PRI: facility << 3 | level); the syslog(2) buffer has the same ``<prio>``.
_DMESG_RAW = re.compile(r"<(?P<prio>\d+)>(?:\[\s*(?P<s>\d+)\.(?P<us>\d+)\] ?)?(?P<message>.*)",
                        re.S)


@dataclass(frozen=True)
class Record:
    """One kernel log record: syslog facility and level, monotonic time, message."""

    facility: int
    level: int
    usec: int | None
    message: str

    @property
    def from_kernel(self) -> bool:
        return self.facility == LOG_KERN

    @property
    def nvrm(self) -> bool:
        """A line the NVIDIA driver printed: the kernel's own, starting with ``NVRM:``."""
        return self.from_kernel and self.message.startswith(NVRM)

    def show(self) -> str:
        """As ``dmesg`` prints it: ``[   12.345678] message``."""
        if self.usec is None:
            return self.message
        return f"[{self.usec // 1_000_000:5d}.{self.usec % 1_000_000:06d}] {self.message}"


def _record(prio: str, usec: int | None, message: str) -> Record:
    value = int(prio)
    return Record(value >> 3, value & 7, usec, message)


def parse_kmsg_record(text: str) -> Record | None:
    """One /dev/kmsg record; None for a continuation (`` KEY=VALUE``) or a malformed one."""
    m = _KMSG.match(text)
    return _record(m["prio"], int(m["usec"]), m["message"]) if m else None


def parse_dmesg_raw(text: str) -> list[Record]:
    """``dmesg --raw`` output; a line without a ``<prio>`` prefix is no record of its own
    (dmesg indents a multi-line message's later lines)."""
    out = []
    for line in text.splitlines():
        if (m := _DMESG_RAW.match(line)) is not None:
            usec = int(m["s"]) * 1_000_000 + int(m["us"]) if m["s"] is not None else None
            out.append(_record(m["prio"], usec, m["message"]))
    return out


@dataclass(frozen=True)
class Event:
    where: str  # PCI:0000:2b:00
    code: int | None  # None: a GSP error line without an Xid
    text: str

    @property
    def action(self) -> str | None:
        """"reboot", "reset" or None (a fault the application may get past)."""
        if self.code == 154:
            low = self.text.lower()
            return "reboot" if "reboot" in low else "reset" if "reset" in low else None
        if self.code in REBOOT:
            return "reboot"
        if self.code in NEEDS_RESET or self.code is None:
            return "reset"
        return None

    def describe(self) -> str:
        label = f"Xid {self.code}" if self.code is not None else "GSP error"
        what = NEEDS_RESET.get(self.code or -1) or self.text.strip().rstrip(".")[:120]
        return f"{label} ({self.where}): {what}"


def parse(records: list[Record]) -> list[Event]:
    """Xid and GSP error events in the driver's own lines (see ``Record.nvrm``)."""
    events = []
    for record in records:
        if not record.nvrm:
            continue
        if (m := _XID.match(record.message)) is not None:
            events.append(Event(m["where"], int(m["code"]), m["text"]))
        elif _GSP.match(record.message) is not None:
            events.append(Event("GSP", None, record.message.removeprefix(NVRM)))
    return events


def since_driver_load(records: list[Record]) -> tuple[list[Record], bool]:
    """The records from the last nvidia.ko load banner on, and whether one was found.

    Without a banner the load is older than every record still in the ring buffer (the
    buffer drops its oldest records first), so all of them count."""
    for i in range(len(records) - 1, -1, -1):
        if records[i].nvrm and records[i].message.startswith(LOAD_BANNER):
            return records[i:], True
    return records, False


def read_kmsg(path: Path) -> list[Record] | None:
    """The records of ``/dev/kmsg``, read without blocking and bounded; None when it cannot
    be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    out: deque[Record] = deque(maxlen=MAX_RECORDS)  # the newest, where there are more
    end, total, pending = time.monotonic() + DEADLINE_S, 0, ""
    try:
        while total < MAX_BYTES and time.monotonic() < end:
            try:
                chunk = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # a record was overwritten while we read: go on
                    continue
                break  # EAGAIN: the end of the buffer
            if not chunk:
                break  # a regular file (a test's), at its end
            total += len(chunk)
            # One whole record per read on the real device; a test's file, one per line
            # (a read may end inside one: keep the rest for the next read).
            *lines, pending = (pending + chunk.decode(errors="replace")).split("\n")
            out.extend(r for line in lines if (r := parse_kmsg_record(line)) is not None)
        if pending and (record := parse_kmsg_record(pending)) is not None:
            out.append(record)
    finally:
        os.close(fd)
    return list(out)
