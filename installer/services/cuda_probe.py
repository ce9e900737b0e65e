"""The CUDA check's child process: the CUDA driver API through ctypes alone, no toolkit.

Run as ``python -I cuda_probe.py <libcuda.so.1> <bytes>`` by ``installer.services.cuda_check``, which
holds the deadline (a hung ``cuInit`` is killed with this process group, never waited for).
Stdlib only and no ``installer`` import, so it runs under ``-I`` from any copy of this file.

cuInit, cuDriverGetVersion, cuDeviceGetCount; then on each device cuCtxCreate and a memory round
trip (cuMemAlloc, cuMemsetD8, cuMemcpyDtoH, compare, cuMemFree, cuCtxDestroy). The calls and
their ``_v2`` names are those of NVIDIA's cuda.h (the names libcuda exports for the 64-bit API);
the sequence is the probe that ran on a real H100 (0.29-0.41 s in all there: docs/nvidia-facts.md,
"CUDA and the fabric on a real H100 node"). Prints one JSON line; the exit status is 0 whenever it printed.

``cuda_probe.py --bounded LIB BYTES`` is how the installer starts it: as pid 1 of a pid
namespace of its own (``unshare --pid --fork --kill-child``, cuda_check.probe_argv), it runs
the probe as its child and prints only the last OUTPUT_MAX_BYTES of what the probe and
libcuda printed; when it exits, or is killed with the Runner's process group, the kernel
kills everything left in the namespace, a child that left the session (setsid) included.
A libcuda without an entry point the probe calls is a JSON error too (``call: dlsym``),
never a traceback.

ctypes is imported by the functions that call libcuda, in this child only: the installer
imports this module for its file name (cuda_check.probe_argv) and a cache hit has no other
use for ctypes (~2 ms of its start-up: docs/performance.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ctypes

PATTERN = 0xA5
OUTPUT_MAX_BYTES = 64 << 10  # the JSON line is well under 4 KiB per GPU
DRAIN_S = 1.0  # after the probe exits: what a child still holding the pipe may add


def main(argv: list[str]) -> int:
    import ctypes  # here, in the probe's own process (the module docstring)

    devices: list[dict[str, Any]] = []
    out: dict[str, Any] = {"ok": False, "count": None, "devices": devices}
    started = time.perf_counter()

    def finish(error: dict[str, Any] | None = None) -> int:
        if error:
            out["error"] = error
        out["total_s"] = round(time.perf_counter() - started, 3)
        print(json.dumps(out), flush=True)
        return 0

    lib, size = argv[1], int(argv[2])
    try:
        cuda = ctypes.CDLL(lib)
    except OSError as exc:
        return finish({"call": "dlopen", "rc": None, "text": str(exc)})

    def failed(call: str, rc: int) -> dict[str, Any]:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        for fn, into in (("cuGetErrorName", name), ("cuGetErrorString", text)):
            if hasattr(cuda, fn):
                getattr(cuda, fn)(rc, ctypes.byref(into))
        return {"call": call, "rc": rc, "name": (name.value or b"").decode(errors="replace"),
                "text": (text.value or b"").decode(errors="replace")}

    t = time.perf_counter()
    rc = cuda.cuInit(0)
    out["cuInit_s"] = round(time.perf_counter() - t, 3)
    if rc:
        return finish(failed("cuInit", rc))
    version, count = ctypes.c_int(), ctypes.c_int()
    if cuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
        out["cuda_driver_version"] = version.value
    rc = cuda.cuDeviceGetCount(ctypes.byref(count))
    if rc:
        return finish(failed("cuDeviceGetCount", rc))
    out["count"] = count.value
    for index in range(count.value):
        device: dict[str, Any] = {"index": index}
        devices.append(device)
        error = round_trip(cuda, index, size, device)
        if error:
            return finish(failed(*error))
    out["ok"] = all(d["roundtrip_ok"] for d in devices)
    return finish()


def round_trip(cuda: ctypes.CDLL, index: int, size: int,
               device: dict[str, Any]) -> tuple[str, int] | None:
    """A context on device ``index`` and ``size`` bytes set on the GPU and read back; the
    failing (call, rc), or None with ``device`` filled in."""
    import ctypes  # here, in the probe's own process (the module docstring)

    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    name, bus = ctypes.create_string_buffer(256), ctypes.create_string_buffer(64)
    lookups: tuple[tuple[str, Callable[[], int]], ...] = (
        ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(dev), index)),
        ("cuDeviceGetName", lambda: cuda.cuDeviceGetName(name, 256, dev)),
        ("cuDeviceGetPCIBusId", lambda: cuda.cuDeviceGetPCIBusId(bus, 64, dev)))
    for call, rc in lookups:
        if (code := rc()) != 0:
            return call, code
    device.update(name=name.value.decode(errors="replace"),
                  bus_id=bus.value.decode(errors="replace"))
    t = time.perf_counter()
    if (code := cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)) != 0:
        return "cuCtxCreate", code
    device["ctx_s"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    host = (ctypes.c_ubyte * size)()
    try:
        if (code := cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size))) != 0:
            return "cuMemAlloc", code
        steps: tuple[tuple[str, Callable[[], int]], ...] = (
            ("cuMemsetD8", lambda: cuda.cuMemsetD8_v2(ptr, ctypes.c_ubyte(PATTERN),
                                                      ctypes.c_size_t(size))),
                 ("cuMemcpyDtoH", lambda: cuda.cuMemcpyDtoH_v2(host, ptr, ctypes.c_size_t(size))),
                 ("cuMemFree", lambda: cuda.cuMemFree_v2(ptr)))
        for call, rc in steps:
            if (code := rc()) != 0:
                return call, code
    finally:
        cuda.cuCtxDestroy_v2(ctx)
    device["roundtrip_ok"] = bytes(host) == bytes([PATTERN]) * size
    device["roundtrip_s"] = round(time.perf_counter() - t, 3)
    return None


def run(argv: list[str]) -> int:
    """``main``, with an entry point libcuda lacks (ctypes' AttributeError: ``…: undefined
    symbol: cuDeviceGet``) answered as the probe's JSON error."""
    try:
        return main(argv)
    except AttributeError as exc:
        found = re.search(r"undefined symbol: ([\w.@]+)", str(exc))
        symbol = found.group(1) if found else "an entry point"
        text = f"{argv[1]} has no {symbol} (undefined symbol): not a whole libcuda"
        error = {"call": "dlsym", "rc": None, "name": "", "text": text}
        print(json.dumps({"ok": False, "count": None, "devices": [], "error": error}),
              flush=True)
        return 0


def bounded(argv: list[str]) -> int:
    """The probe as a child, its stdout and stderr together kept to their last
    OUTPUT_MAX_BYTES, printed once it exits; its exit status (128+N for a signal)."""
    child = subprocess.Popen([sys.executable, "-I", __file__, *argv],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
    kept = bytearray()
    assert child.stdout is not None  # stdout=PIPE
    stdout = child.stdout

    def drain() -> None:
        while chunk := os.read(stdout.fileno(), 1 << 16):
            kept.extend(chunk)
            del kept[:-OUTPUT_MAX_BYTES]

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    rc = child.wait()
    reader.join(DRAIN_S)  # a child of the probe holding the pipe: not waited for
    sys.stdout.buffer.write(bytes(kept[-OUTPUT_MAX_BYTES:]))
    sys.stdout.flush()
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    if sys.argv[1:2] == ["--bounded"]:
        sys.exit(bounded(sys.argv[2:]))
    sys.exit(run(sys.argv))
