"""The kernel log's NVIDIA Xid and GSP error lines, and which mean "reset or reboot".

The driver reports GPU faults as ``NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the
bus.`` (the form in NVIDIA/open-gpu-kernel-modules issue reports: #1151, #1271, #1045); Xid
154 says the recovery the driver wants in words (``GPU recovery action changed from 0x0
(None) to 0x1 (GPU Reset Required)``). Which codes need a GPU reset or a node reboot follows
the "Resolution Bucket (Immediate Action)" column of NVIDIA's Xid catalog
(docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): RESET_GPU and RESTART_BM.

The log is read bounded: ``/dev/kmsg`` without blocking (one record per read, EAGAIN at the
end), at most MAX_RECORDS records, MAX_BYTES bytes and DEADLINE_S seconds; ``dmesg`` where
/dev/kmsg cannot be read.
"""

from __future__ import annotations

import errno
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

MAX_RECORDS = 50_000
MAX_BYTES = 8 << 20
DEADLINE_S = 3.0

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
_XID = re.compile(r"NVRM: Xid \((?P<where>[^)]*)\): (?P<code>\d+),? ?(?P<text>.*)")
_GSP = re.compile(r"NVRM: .*GSP.*(timeout|timed out|error|fail)", re.IGNORECASE)


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


def parse(lines: list[str]) -> list[Event]:
    """Xid and GSP error events in kernel log lines (kmsg records or dmesg lines)."""
    events = []
    for line in lines:
        if (m := _XID.search(line)) is not None:
            events.append(Event(m["where"], int(m["code"]), m["text"]))
        elif (g := _GSP.search(line)) is not None:
            events.append(Event("GSP", None, line[g.start():].removeprefix("NVRM: ")))
    return events


def read_kmsg(path: Path) -> list[str] | None:
    """The messages of ``/dev/kmsg`` (``prio,seq,usec,flags;text``), read without blocking
    and bounded; None when it cannot be opened (then: dmesg)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    out: list[str] = []
    end, total = time.monotonic() + DEADLINE_S, 0
    try:
        while len(out) < MAX_RECORDS and total < MAX_BYTES and time.monotonic() < end:
            try:
                chunk = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # a record was overwritten while we read: go on
                    continue
                break  # EAGAIN: the end of the buffer
            if not chunk:
                break  # a regular file (a test's), at its end
            total += len(chunk)
            for record in chunk.decode(errors="replace").splitlines():
                if not record.startswith(" "):  # continuation lines: KEY=VALUE metadata
                    out.append(record.split(";", 1)[-1])
    finally:
        os.close(fd)
    return out
