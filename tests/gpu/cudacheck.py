"""CUDA through the driver API alone (ctypes on libcuda.so.1, no toolkit): cuInit, the device
count, then per device a context and a 64 MiB alloc + memset + copy back. Prints one JSON
line. Run by the tier as uid 65534 in a private /dev (shared/reference/gpu-node/cudacheck.py
is the probe this follows); stdlib only, so it runs under ``python3 -I``."""
import ctypes
import json
import sys
import time

out = {"ok": False, "devices": []}
t0 = time.perf_counter()


def fail(name, rc, cuda=None):
    err = {"call": name, "rc": rc}
    if cuda is not None:
        s, n = ctypes.c_char_p(), ctypes.c_char_p()
        cuda.cuGetErrorString(rc, ctypes.byref(s))
        cuda.cuGetErrorName(rc, ctypes.byref(n))
        err.update(name=(n.value or b"").decode(), text=(s.value or b"").decode())
    out["error"] = err
    out["total_s"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(out))
    sys.exit(1)


def check(name, rc):
    if rc:
        fail(name, rc, cuda)


try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    out["error"] = {"call": "dlopen libcuda.so.1", "text": str(exc)}
    print(json.dumps(out))
    sys.exit(1)
t = time.perf_counter()
rc = cuda.cuInit(0)
out["cuInit_s"] = round(time.perf_counter() - t, 3)
check("cuInit", rc)
ver, n = ctypes.c_int(), ctypes.c_int()
cuda.cuDriverGetVersion(ctypes.byref(ver))
out["cuda_driver_version"] = ver.value
check("cuDeviceGetCount", cuda.cuDeviceGetCount(ctypes.byref(n)))
out["count"] = n.value
size = 64 << 20
for i in range(n.value):
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    name = ctypes.create_string_buffer(256)
    bus = ctypes.create_string_buffer(64)
    check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), i))
    check("cuDeviceGetName", cuda.cuDeviceGetName(name, 256, dev))
    check("cuDeviceGetPCIBusId", cuda.cuDeviceGetPCIBusId(bus, 64, dev))
    t1 = time.perf_counter()
    check(f"cuCtxCreate (device {i})", cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))
    t2 = time.perf_counter()
    check(f"cuMemAlloc 64 MiB (device {i})", cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)))
    host = (ctypes.c_ubyte * size)()
    check(f"cuMemsetD8 (device {i})", cuda.cuMemsetD8_v2(ptr, ctypes.c_ubyte(0xA5), ctypes.c_size_t(size)))
    check(f"cuMemcpyDtoH (device {i})", cuda.cuMemcpyDtoH_v2(host, ptr, ctypes.c_size_t(size)))
    check(f"cuMemFree (device {i})", cuda.cuMemFree_v2(ptr))
    check(f"cuCtxDestroy (device {i})", cuda.cuCtxDestroy_v2(ctx))
    out["devices"].append({"name": name.value.decode(), "bus_id": bus.value.decode(),
                           "ctx_s": round(t2 - t1, 3),
                           "roundtrip_ok": host[0] == 0xA5 and host[size - 1] == 0xA5
                           and host[size // 2] == 0xA5,
                           "roundtrip_s": round(time.perf_counter() - t2, 3)})
out["ok"] = all(d["roundtrip_ok"] for d in out["devices"])
out["total_s"] = round(time.perf_counter() - t0, 3)
print(json.dumps(out))
