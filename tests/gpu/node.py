"""The GPU node this tier runs on: is there one, where its driver's user space is, its
read-only facts, and the snapshot that must not change (tests/gpu/guard.py says how)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SYS = Path("/sys")
PROC = Path("/proc")
NOBODY = 65534
# The tool's own install dir (settings.DEFAULT_INSTALL_DIR_HOST on a node's / , and the
# container path GKE and our DaemonSet mount): used when it holds a .cache record.
OWN_INSTALL_DIRS = (Path("/home/kubernetes/bin/nvidia"), Path("/usr/local/nvidia"))
# nvidia-smi state that a read-only run must leave as it was (one query each: a field an
# older nvidia-smi does not know is "unsupported" both times).
STATE_FIELDS = ("persistence_mode", "mig.mode.current", "mig.mode.pending", "compute_mode",
                "clocks.applications.graphics", "clocks.applications.memory",
                "ecc.mode.current", "ecc.mode.pending", "power.limit", "accounting.mode")


@dataclass(frozen=True)
class PciFunction:
    address: str  # 0000:00:06.0
    device_id: str  # 0x2330
    pci_class: str
    driver: str | None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def nvidia_pci(sys_dir: Path = SYS) -> list[PciFunction]:
    """NVIDIA display/3D controllers (vendor 0x10de, class 0x03xxxx) and their bound driver."""
    found = []
    for dev in sorted((sys_dir / "bus/pci/devices").glob("*")):
        if _read(dev / "vendor") != "0x10de" or not (_read(dev / "class") or "").startswith("0x03"):
            continue
        link = dev / "driver"
        driver = os.path.basename(os.readlink(link)) if link.is_symlink() else None
        found.append(PciFunction(dev.name, _read(dev / "device") or "?", _read(dev / "class") or "?",
                                 driver))
    return found


def find_smi(install_dir: Path | None, path: str | None = None) -> Path | None:
    if install_dir is not None and (install_dir / "bin/nvidia-smi").is_file():
        return install_dir / "bin/nvidia-smi"
    found = shutil.which("nvidia-smi", path=path)
    return Path(found) if found else None


def choose_install_dir(env: dict[str, str], own: tuple[Path, ...] = OWN_INSTALL_DIRS,
                       path: str | None = None) -> tuple[Path | None, str]:
    """``--install-dir`` for the installer's commands, and why: NDI_GPU_INSTALL_DIR, else the
    tool's own install dir if it holds a .cache record, else the dir holding the nvidia-smi
    on PATH's parent (/usr/local/nvidia/bin/nvidia-smi: /usr/local/nvidia, GKE's layout)."""
    if env.get("NDI_GPU_INSTALL_DIR"):
        return Path(env["NDI_GPU_INSTALL_DIR"]), "NDI_GPU_INSTALL_DIR"
    for d in own:
        if (d / ".cache").is_file():
            return d, f"the installer's own install dir ({d}/.cache is its record)"
    smi = shutil.which("nvidia-smi", path=path if path is not None else env.get("PATH"))
    if smi:
        return Path(smi).parent.parent, f"the parent of the dir of nvidia-smi on PATH ({smi})"
    return None, "no NDI_GPU_INSTALL_DIR, no install record, no nvidia-smi on PATH"


def absent_reason(sys_dir: Path, smi: Path | None) -> str | None:
    """None when this is a GPU node the tier can check; else one line saying why not."""
    pci = nvidia_pci(sys_dir)
    if not pci:
        return (f"no NVIDIA GPU: no PCI display controller of vendor 0x10de in "
                f"{sys_dir}/bus/pci/devices")
    bound = [f for f in pci if f.driver == "nvidia"]
    if not bound:
        drivers = ", ".join(f"{f.address} {f.driver or 'no driver'}" for f in pci)
        return f"no NVIDIA GPU bound to the nvidia driver ({drivers})"
    if smi is None:
        return ("no nvidia-smi: none in the install dir's bin/ nor on PATH (set "
                "NDI_GPU_INSTALL_DIR to the driver's user space)")
    return None


def norm_bus_id(bus_id: str) -> str:
    """nvidia-smi's 00000000:00:06.0 and sysfs's 0000:00:06.0 as one form."""
    m = re.fullmatch(r"(?:([0-9a-fA-F]+):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", bus_id.strip())
    if not m:
        return bus_id.strip().lower()
    return f"{int(m.group(1) or '0', 16):04x}:{m.group(2)}:{m.group(3)}.{m.group(4)}".lower()


@dataclass
class GpuNode:
    install_dir: Path
    install_dir_why: str
    smi: Path
    pci: list[PciFunction]
    has_record: bool
    results: dict[str, object] = field(default_factory=dict)

    @property
    def lib64(self) -> Path:
        return self.install_dir / "lib64"

    def smi_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        if self.lib64.is_dir():
            env["LD_LIBRARY_PATH"] = str(self.lib64)
        return env

    def smi_run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """nvidia-smi on the read-only node view (tests/gpu/launch.py job ``run``)."""
        return self.smi_runs([list(args)], timeout=timeout)[0]

    def smi_runs(self, argss: list[list[str]], timeout: float = 60
                 ) -> list[subprocess.CompletedProcess[str]]:
        """Several nvidia-smi runs in one private namespace."""
        argvs = [[str(self.smi), *args] for args in argss]
        with tempfile.TemporaryDirectory(prefix="ndi-gpu-smi-") as tmp:
            out = in_namespace({"job": "run", "argvs": argvs, "env": self.smi_env(),
                                "install_dir": str(self.install_dir), "timeout": timeout},
                               Path(tmp) / "run.json", timeout=timeout * len(argvs) + 60)
        if "runs" not in out:
            raise AssertionError(f"nvidia-smi in the private namespace: {out}")
        return [subprocess.CompletedProcess(argv, r["rc"], r["stdout"], r["stderr"])
                for argv, r in zip(argvs, out["runs"], strict=True)]

    def query(self, fields: str) -> list[list[str]]:
        proc = self.smi_run(f"--query-gpu={fields}", "--format=csv,noheader")
        assert proc.returncode == 0, f"nvidia-smi --query-gpu={fields}: rc {proc.returncode}: " \
                                     f"{proc.stdout}{proc.stderr}"
        return [[c.strip() for c in line.split(",")] for line in proc.stdout.splitlines()
                if line.strip()]

    def modules(self) -> dict[str, str]:
        """/proc/modules: name -> size (a load or unload changes the set)."""
        text = _read(PROC / "modules") or ""
        return {f[0]: f[1] for f in (ln.split() for ln in text.splitlines()) if len(f) >= 2}

    def gpu_minors(self) -> list[int]:
        minors = []
        for info in sorted((PROC / "driver/nvidia/gpus").glob("*/information")):
            m = re.search(r"^Device Minor:\s*(\d+)", _read(info) or "", re.M)
            if m:
                minors.append(int(m.group(1)))
        return sorted(minors)

    def params(self) -> str | None:
        return _read(PROC / "driver/nvidia/params")

    def smi_state(self) -> dict[str, str]:
        procs = self.smi_runs([[f"--query-gpu=pci.bus_id,{name}", "--format=csv,noheader"]
                               for name in STATE_FIELDS])
        return {name: proc.stdout.strip() if proc.returncode == 0 else "unsupported"
                for name, proc in zip(STATE_FIELDS, procs, strict=True)}

    def snapshot(self) -> dict[str, object]:
        """The node's state, read in this order: what needs no program first (the node's
        /dev, module state, the install dir), nvidia-smi last (and in a private namespace:
        it cannot add a file to the node's /dev before that was listed)."""
        snap: dict[str, object] = {"dev": dev_listing(Path("/dev"))}
        snap["modules"] = self.modules()
        snap["params"] = self.params()
        snap["install_dir"] = tree_listing(self.install_dir)
        snap["smi"] = self.smi_state()
        return snap


TREE_LIMIT = 50_000


def tree_listing(root: Path) -> dict[str, str]:
    """Every file under ``root``: kind, mode, size, mtime (a link: its target); at most
    TREE_LIMIT entries (then a marker says so)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = Path(dirpath, name)
            try:
                st = p.lstat()
            except OSError:
                continue
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = f"-> {os.readlink(p)}"
            else:
                out[rel] = (f"{stat.filemode(st.st_mode)} {st.st_size} {st.st_mtime_ns}"
                            if not stat.S_ISDIR(st.st_mode) else f"{stat.filemode(st.st_mode)}")
            if len(out) >= TREE_LIMIT:
                out["..."] = f"more than {TREE_LIMIT} entries"
                return out
    return out


def dev_listing(dev: Path) -> dict[str, str]:
    """NVIDIA files in a /dev: name -> kind, device numbers, mode (char links included)."""
    out = {}
    paths = [*dev.glob("nvidia*"), *dev.glob("nvidia-caps/*"), *dev.glob("char/*")]
    for p in sorted(paths):
        try:
            st = p.lstat()
        except OSError:
            continue
        rel = str(p.relative_to(dev))
        if p.is_symlink():
            target = os.readlink(p)
            if rel.startswith("char/") and "nvidia" not in target:
                continue
            out[rel] = f"-> {target}"
        elif p.is_char_device():
            out[rel] = f"c {os.major(st.st_rdev)}:{os.minor(st.st_rdev)} {st.st_mode & 0o7777:04o}"
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = "other"
    return out


def launcher(*args: str) -> list[str]:
    """A Python child with the guard installed (tests/gpu/launch.py)."""
    return [sys.executable, "-m", "tests.gpu.launch", *args]


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


@dataclass
class CliResult:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    namespace: dict[str, object] = field(default_factory=dict)  # launch.enter_private_node's

    def json(self) -> object:
        return json.loads(self.stdout)

    def describe(self) -> str:
        return (f"installer {' '.join(self.argv)}: rc {self.returncode} in {self.seconds:.2f}s\n"
                f"stdout: {self.stdout[-3000:]}\nstderr: {self.stderr[-3000:]}")


def cli(*argv: str, timeout: float = 300) -> CliResult:
    """The installer's CLI as a guarded child on the read-only node view: its own mount
    namespace, /dev a tmpfs with copies of the node's NVIDIA device files, module tools and
    nvidia-modprobe stubbed (tests/gpu/launch.py). ``namespace`` says what it had."""
    install_dir = argv[argv.index("--install-dir") + 1] if "--install-dir" in argv else None
    t = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ndi-gpu-cli-") as tmp:
        attest = Path(tmp) / "namespace.json"
        ns = {"parent_mnt_ns": os.stat("/proc/self/ns/mnt").st_ino,
              "install_dir": install_dir, "attest": str(attest)}
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--", *launcher("cli", *argv)],
            capture_output=True, text=True, cwd=ROOT, timeout=timeout,
            env=child_env(NDI_GPU_NS=json.dumps(ns)))
        namespace = json.loads(attest.read_text()) if attest.is_file() else {}
    return CliResult(list(argv), proc.returncode, proc.stdout, proc.stderr,
                     time.perf_counter() - t, namespace)


def in_namespace(spec: dict[str, object], out: Path, timeout: float = 300) -> dict[str, object]:
    """Run a tests/gpu/launch.py ``ns`` job in a private mount namespace (unshare -m,
    propagation private); the job writes its JSON result to ``out``."""
    spec = {**spec, "out": str(out), "parent_mnt_ns": os.stat("/proc/self/ns/mnt").st_ino}
    spec_file = out.with_name(out.name + ".spec.json")
    spec_file.write_text(json.dumps(spec))
    argv = ["unshare", "--mount", "--propagation", "private", "--",
            *launcher("ns", str(spec_file))]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env=child_env())
    if not out.is_file():
        raise AssertionError(f"namespace job {spec.get('job')} left no result: rc "
                             f"{proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = json.loads(out.read_text())
    result["_rc"] = proc.returncode
    result["_stderr"] = proc.stderr[-3000:]
    return result
