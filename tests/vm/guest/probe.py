"""Print the guest's NVIDIA driver state as one JSON document (stdout)."""

import hashlib
import json
import os
import subprocess
import sys

INSTALL = sys.argv[1] if len(sys.argv) > 1 else "/home/kubernetes/bin/nvidia"
OURS = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_holder")


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def modules():
    out = {}
    for line in (read("/proc/modules") or "").splitlines():
        f = line.split()
        users = [u for u in f[3].split(",") if u and u != "-"]
        out[f[0]] = {"refcnt": int(f[2]), "used_by": users, "state": f[4], "line": line}
    return out


def sysmodule(name):
    d = f"/sys/module/{name}"
    if not os.path.isdir(d):
        return None
    params = {}
    if os.path.isdir(d + "/parameters"):
        for p in sorted(os.listdir(d + "/parameters")):
            params[p] = read(f"{d}/parameters/{p}")
    holders = sorted(os.listdir(d + "/holders")) if os.path.isdir(d + "/holders") else []
    return {
        "version": read(d + "/version"),
        "refcnt": read(d + "/refcnt"),
        "taint": read(d + "/taint"),
        "holders": holders,
        "parameters": params,
    }


def tree(root):
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                files[rel] = "-> " + os.readlink(path)
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    files[rel] = hashlib.sha256(f.read()).hexdigest()
    return files


def devices():
    out = {}
    for name in sorted(os.listdir("/dev")):
        if name.startswith("nvidia"):
            st = os.stat("/dev/" + name)
            out[name] = [os.major(st.st_rdev), os.minor(st.st_rdev), oct(st.st_mode & 0o777)]
    return out


def run(argv, env=None, limit=3000):
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        out = cp.stdout + cp.stderr
        return {"rc": cp.returncode, "out": out[-limit:] if limit else out}
    except OSError as exc:
        return {"rc": None, "out": str(exc)}


def main():
    ldconf = {}
    for d in ("/etc/ld.so.conf.d",):
        for name in sorted(os.listdir(d)):
            ldconf[f"{d}/{name}"] = read(f"{d}/{name}")
    ldp = run(["ldconfig", "-p"], limit=None)["out"].splitlines()
    status = read(INSTALL + "/status.json")
    state = {
        "kernel": os.uname().release,
        "modules": {k: v for k, v in modules().items() if k in OURS or k == "drm"},
        "sysmodule": {m: sysmodule(m) for m in OURS},
        # nvidia's parameters: not in sysfs, as NVIDIA's (kmod-src/nvidia.c says why)
        "nvidia_params": read("/proc/driver/nvidia/params"),
        "devices": devices(),
        "ldconfig": [ln.strip() for ln in ldp if "nvidia" in ln or "cuda" in ln],
        # nvidia-smi with nothing on the library path: libnvidia-ml.so.1 must
        # resolve through /etc/ld.so.cache.
        "smi": run([INSTALL + "/bin/nvidia-smi"], env={"PATH": "/usr/bin:/bin"}),
        "install": tree(INSTALL),
        "cache": read(INSTALL + "/.cache"),
        "status": json.loads(status) if status else None,
        "ld_so_conf": ldconf,
    }
    print(json.dumps(state))


if __name__ == "__main__":
    main()
