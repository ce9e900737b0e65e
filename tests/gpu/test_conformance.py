"""The installer's read-only commands against a real NVIDIA GPU node (``make test-gpu``).

Each test runs the installer as a guarded child (tests/gpu/launch.py) and checks what it
says against what NVIDIA's own tools say on the same node. Nothing here loads or unloads a
module or changes a GPU setting; device files are made only in a private mount namespace on
an empty tmpfs /dev (tests/gpu/guard.py, and the snapshot conftest.read_only compares)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import statistics
import time
from pathlib import Path

import pytest

from installer.base.errors import ExitCode, VerifyError
from installer.host.installdir import Tree
from installer.host.runner import CommandError, CommandResult
from installer.records.outcome import Outcome
from installer.services import verify
from tests.gpu.conftest import report_dir
from tests.gpu.node import GpuNode, cli, in_namespace, norm_bus_id

SMI_FIELDS = "pci.bus_id,name,driver_version,pci.device_id,mig.mode.current,compute_mode"
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
# doctor checks about what *this installer* made: they say nothing about the driver's health
# and are only judged when the install dir holds the installer's .cache record.
INSTALLER_MADE = {"installer_status", "cache", "install_dir", "host_ld_cache", "readiness",
                  "dev_char_symlinks"}


@pytest.fixture(scope="session")
def smi(gpu_node: GpuNode) -> list[dict[str, str]]:
    """What nvidia-smi says about each GPU: the reference the installer is checked against."""
    names = SMI_FIELDS.split(",")
    rows = [dict(zip(names, row, strict=True)) for row in gpu_node.query(SMI_FIELDS)]
    assert rows, "nvidia-smi lists no GPU on a node with an NVIDIA GPU bound to nvidia"
    gpu_node.results["device"] = [f"{r['name']} ({r['pci.bus_id']})" for r in rows]
    gpu_node.results["driver_version"] = rows[0]["driver_version"]
    return rows


def host_args(install_dir: Path) -> list[str]:
    return ["--host-root", "/", "--install-dir", str(install_dir), "--log-format", "json"]


def loaded(module: str) -> bool:
    return any(ln.split()[0] == module for ln in Path("/proc/modules").read_text().splitlines()
               if ln.strip())


def test_detect_names_every_gpu_and_the_loaded_driver(gpu_node, smi):
    res = cli("detect", *host_args(gpu_node.install_dir), "-o", "json")
    assert res.returncode == 0, res.describe()
    doc = res.json()
    found = {norm_bus_id(g["address"]): g for g in doc["gpus"]}
    for row in smi:
        bus = norm_bus_id(row["pci.bus_id"])
        assert bus in found, f"detect does not name {row['name']} at {bus}: {sorted(found)}"
        # pci.device_id is 0x233010DE: device 0x2330, vendor 0x10de.
        want = "0x" + row["pci.device_id"].lower().removeprefix("0x")[:4]
        assert found[bus]["device_id"].lower() == want, (found[bus], row)
    assert len(found) == len(smi), f"detect names GPUs nvidia-smi does not: {sorted(found)}"
    versions = {r["driver_version"] for r in smi}
    assert len(versions) == 1, versions
    assert doc["loaded_driver_version"] == versions.pop(), res.describe()


def test_verify_passes(gpu_node, smi):
    res = cli("verify", *host_args(gpu_node.install_dir), "-o", "json")
    assert res.returncode == 0, res.describe()
    listed = {norm_bus_id(g["bus_id"]): g for g in res.json()}
    assert set(listed) == {norm_bus_id(r["pci.bus_id"]) for r in smi}, res.describe()
    assert {g["driver_version"] for g in listed.values()} == {smi[0]["driver_version"]}
    # Issue 31: verify ran CUDA on every GPU nvidia-smi lists (a context and a memory round
    # trip each, as root here; the tier's read-only rules allow a context).
    checks = [json.loads(ln) for ln in res.stderr.splitlines() if '"cuda_check_ok"' in ln]
    assert checks and checks[-1]["gpus"] == len(smi), res.describe()
    gpu_node.results["cuda_check_s"] = checks[-1]["total_s"]


def _gke_installer_pod() -> bool:
    pods = Path("/var/log/pods")
    return pods.is_dir() and any("nvidia-driver-installer" in p.name for p in pods.iterdir())


def _plugin_socket() -> bool:
    return DEVICE_PLUGIN_DIR.is_dir() and any(
        stat.S_ISSOCK(p.lstat().st_mode) for p in DEVICE_PLUGIN_DIR.glob("nvidia*.sock"))


def _low_disk(path: Path) -> bool:
    while not path.exists():
        path = path.parent
    st = os.statvfs(path)
    writable = not st.f_flag & os.ST_RDONLY
    return writable and st.f_bavail * st.f_frsize < 2 << 30


def legitimate_warnings(gpu_node: GpuNode) -> dict[str, str]:
    """The doctor WARNs a healthy node may give, each only when its fact holds here."""
    ok: dict[str, str] = {
        # A true statement about NVIDIA's calendar, not about this node's health.
        "driver_branch": "the loaded driver's branch is past its support end",
    }
    if not _plugin_socket():
        ok["device_plugin"] = f"no NVIDIA device plugin socket in {DEVICE_PLUGIN_DIR} (bare node)"
    if _gke_installer_pod():
        ok["gke_installer"] = "GKE's installer DaemonSet has a pod here (/var/log/pods)"
    if _low_disk(gpu_node.install_dir):
        ok["disk_space"] = "under 2 GiB free on a writable install dir"
    status = gpu_node.install_dir / "status.json"
    try:
        if Outcome.from_status_json(json.loads(status.read_text())).staged:
            ok["installer_status"] = "a driver is staged for the next boot"
    except (OSError, ValueError, AttributeError):
        pass
    return ok


def test_doctor_is_healthy_with_only_legitimate_warnings(gpu_node, smi):
    res = cli("doctor", *host_args(gpu_node.install_dir), "-o", "json")
    assert res.stdout.lstrip().startswith("{"), res.describe()
    report = json.loads(res.stdout)
    allowed = legitimate_warnings(gpu_node)
    exempt = set() if gpu_node.has_record else INSTALLER_MADE
    findings = {f["check"]: f for f in report["findings"]}
    gpu_node.results["doctor"] = {
        "exempt_without_install_record": sorted(exempt),
        "findings": {k: f"{f['verdict']}: {f['detail']}" for k, f in findings.items()}}
    wrong = []
    for name, f in findings.items():
        if name in exempt or f["verdict"] == "ok":
            continue
        if f["verdict"] == "warn" and name in allowed:
            continue
        wrong.append(f"{f['verdict'].upper()} {name}: {f['detail']} (fix: {f['fix']})")
    assert not wrong, ("doctor on a working GPU node:\n  " + "\n  ".join(wrong)
                       + f"\nlegitimate WARNs here: {allowed}; not judged (no .cache record in "
                       f"{gpu_node.install_dir}): {sorted(exempt)}")
    # The driver-health checks run and pass whatever put the driver here.
    for name in ("gpus", "kernel_modules", "gpu_firmware", "device_nodes", "nvidia_smi"):
        assert findings.get(name, {}).get("verdict") == "ok", (name, findings.get(name))
    if gpu_node.has_record:
        assert res.returncode == 0 and report["healthy"], res.describe()
    assert smi[0]["driver_version"] in findings["nvidia_smi"]["detail"]


def _nvidia_modprobe(gpu_node: GpuNode) -> Path | None:
    own = gpu_node.install_dir / "bin/nvidia-modprobe"
    if own.is_file():
        return own
    found = shutil.which("nvidia-modprobe")
    return Path(found) if found else None


def _uvm_major() -> int:
    for line in Path("/proc/devices").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == "nvidia-uvm":
            return int(parts[0])
    raise AssertionError("/proc/devices has no nvidia-uvm: nvidia_uvm is not loaded")


def test_device_files_step_makes_what_cuda_needs_and_cuda_works(gpu_node, smi, tmp_path):
    modprobe = _nvidia_modprobe(gpu_node)
    if modprobe is None:
        pytest.skip(f"no nvidia-modprobe in {gpu_node.install_dir}/bin or on PATH: the device-"
                    "file step cannot be run")
    minors = gpu_node.gpu_minors()
    assert len(minors) == len(smi), f"/proc/driver/nvidia/gpus minors {minors} vs {len(smi)} GPUs"
    out = in_namespace({"job": "devnodes", "modprobe": str(modprobe),
                        "lib64": str(gpu_node.lib64) if gpu_node.lib64.is_dir() else None},
                       tmp_path / "devnodes.json")
    gpu_node.results["devnodes"] = out
    assert "crashed" not in out and "refused" not in out, out
    assert out["module_calls"] == [], f"the device-file step asked to load modules: {out}"
    assert "error" not in out, f"installer.kmod.devnodes.create failed: {out['error']}"
    params = gpu_node.params() or ""
    mode = next((int(ln.split(":")[1]) for ln in params.splitlines()
                 if ln.startswith("DeviceFileMode:")), 0o666)
    uvm = _uvm_major()
    want = {"nvidiactl": (195, 255), **{f"nvidia{m}": (195, m) for m in minors},
            "nvidia-uvm": (uvm, 0), "nvidia-uvm-tools": (uvm, 1)}
    if loaded("nvidia_modeset"):
        want["nvidia-modeset"] = (195, 254)
    made = {k: v for k, v in out["dev"].items() if "/" not in k and k.startswith("nvidia")}
    assert sorted(made) == sorted(want), f"device files made: {made}, CUDA needs {sorted(want)}"
    for name, (major, minor) in want.items():
        assert made[name] == f"c {major}:{minor} {mode:04o}", (name, made[name])
        link = out["dev"].get(f"char/{major}:{minor}")
        assert link is not None and link.endswith(f"/{name}") or link == f"-> ../{name}", (
            f"/dev/char/{major}:{minor} for /dev/{name}: {link}")
    assert sorted(out["created"]) == sorted(want), out["created"]

    if any(r["mig.mode.current"] == "Enabled" for r in smi):
        pytest.skip("MIG is enabled: CUDA sees MIG devices only through /dev/nvidia-caps "
                    "(not checked by this tier); the device files were")
    busy = [r for r in smi if r["compute_mode"] not in ("Default",)]
    if busy:
        pytest.skip(f"compute mode not Default ({busy[0]['compute_mode']}): a context may be "
                    "refused while workloads run; the device files were checked")
    cuda = out["cuda"]
    try:
        doc = json.loads(cuda["stdout"].strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise AssertionError(f"CUDA check printed no result: {cuda}") from None
    gpu_node.results["cuda"] = doc
    assert cuda["rc"] == 0 and doc["ok"], f"CUDA as uid 65534 with these device files: {doc}"
    assert doc["count"] == len(smi), doc
    assert {norm_bus_id(d["bus_id"]) for d in doc["devices"]} == {
        norm_bus_id(r["pci.bus_id"]) for r in smi}, doc
    assert out["dev_after_cuda"] == out["dev"], "libcuda made device files as uid 65534"


def _real_failure(gpu_node: GpuNode, rc: int, stdout: str, stderr: str) -> VerifyError:
    """verify.nvidia_smi's own handling of this exact output: its Runner raises what ours
    would have for the real exit code and words."""

    class Replay:
        def run(self, argv, **_):
            raise CommandError(CommandResult(tuple(map(str, argv)), rc, stdout, stderr, 0.0))

    with pytest.raises(VerifyError) as exc:
        verify.nvidia_smi(Tree(gpu_node.install_dir), Replay())  # type: ignore[arg-type]
    return exc.value


def _hint(words: str) -> str:
    return next(h for text, h in verify.SMI_FAILURES if text == words)


def test_nvidia_smi_exit_9_is_classified(gpu_node, smi, tmp_path):
    out = in_namespace({"job": "smi_nobody", "smi": str(gpu_node.smi), "env": gpu_node.smi_env()},
                       tmp_path / "smi9.json")
    gpu_node.results["smi_exit_9"] = out
    assert "crashed" not in out, out
    assert out["rc"] == 9, f"nvidia-smi as uid 65534 in an empty /dev: {out}"
    assert not [k for k in out["dev"] if k.startswith("nvidia")], out["dev"]
    err = _real_failure(gpu_node, out["rc"], out["stdout"], out["stderr"])
    assert err.exit_code == ExitCode.VERIFY
    assert err.hint == _hint("couldn't communicate with the NVIDIA driver"), (err.message, err.hint)


def test_nvidia_smi_exit_12_is_classified(gpu_node, smi, tmp_path):
    import subprocess

    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=60).stdout
    libs = [ln.rsplit("=>", 1)[1].strip() for ln in cache.splitlines()
            if ln.strip().startswith("libnvidia-ml.so.1 ")]
    libs.append(str(gpu_node.lib64 / "libnvidia-ml.so.1"))
    out = in_namespace({"job": "smi_nolib", "smi": str(gpu_node.smi), "env": gpu_node.smi_env(),
                        "libs": libs}, tmp_path / "smi12.json")
    gpu_node.results["smi_exit_12"] = out
    assert "crashed" not in out and out["hidden"], out
    assert out["rc"] == 12, f"nvidia-smi with libnvidia-ml.so.1 hidden: {out}"
    err = _real_failure(gpu_node, out["rc"], out["stdout"], out["stderr"])
    assert err.hint == _hint("couldn't find libnvidia-ml.so"), (err.message, err.hint)


def _kernel_setting() -> tuple[str | None, set[int]]:
    """The setting a fresh install must refuse on (and its documented exit codes), if any."""
    if Path("/proc/sys/kernel/modules_disabled").read_text().strip() == "1":
        return "modules_disabled", {int(ExitCode.MODULE_LOAD), int(ExitCode.SECURE_BOOT)}
    enforce = Path("/sys/module/module/parameters/sig_enforce")
    if (enforce.is_file() and enforce.read_text().strip() == "Y") or \
            "module.sig_enforce=1" in Path("/proc/cmdline").read_text().split():
        return "sig_enforce", {int(ExitCode.SECURE_BOOT)}
    return None, set()


def test_install_dry_run_plans_what_a_person_expects(gpu_node, smi, tmp_path):
    empty = tmp_path / "install"
    empty.mkdir()
    # --install-dir-host names the same dir: the dry run refuses a mismatch as the real run does.
    res = cli("install", "--dry-run", "--host-root", "/", "--install-dir", str(empty),
              "--install-dir-host", str(empty), "--log-format", "json", "-o", "json")
    setting, codes = _kernel_setting()
    gpu_node.results["dry_run"] = {"kernel_setting": setting, "rc": res.returncode,
                                   "stdout": res.stdout[-4000:], "stderr": res.stderr[-2000:]}
    if res.returncode != 0:
        assert setting is not None, f"dry run refused on a kernel that loads modules: " \
                                    f"{res.describe()}"
        assert res.returncode in codes, f"{setting}: exit {res.returncode}, documented " \
                                        f"{sorted(codes)}: {res.describe()}"
        assert setting in res.stderr or setting.replace("_", ".") in res.stderr, (
            f"the refusal does not name {setting}: {res.describe()}")
        return
    assert setting != "modules_disabled", (
        f"kernel.modules_disabled=1: nothing can be loaded, yet the dry run planned: {res.stdout}")
    plan = res.json()
    assert plan["steps"] and all(s["name"] for s in plan["steps"]), plan
    assert plan.get("driver_version"), plan
    text = json.dumps(plan).lower()
    gpu_words = {w for r in smi for w in (r["name"].lower(), norm_bus_id(r["pci.bus_id"]),
                                         r["pci.device_id"].lower()[2:6])}
    assert any(w in text for w in gpu_words), f"the plan names no GPU ({gpu_words}): {plan}"
    assert smi[0]["driver_version"] in text, f"the plan does not name the loaded driver: {plan}"


def test_verify_timing_against_nvidia_smi_alone(gpu_node, smi):
    verify_s, smi_s = [], []
    for _ in range(3):
        res = cli("verify", *host_args(gpu_node.install_dir), "-o", "json")
        assert res.returncode == 0, res.describe()
        verify_s.append(res.seconds)
        t = time.perf_counter()
        proc = gpu_node.smi_run("--query-gpu=name,driver_version,pci.bus_id", "--format=csv,noheader")
        smi_s.append(time.perf_counter() - t)
        assert proc.returncode == 0, proc.stderr
    timings = {"verify_s": [round(s, 3) for s in verify_s], "nvidia_smi_s": [round(s, 3) for s in smi_s],
               "verify_median_s": round(statistics.median(verify_s), 3),
               "nvidia_smi_median_s": round(statistics.median(smi_s), 3)}
    timings["overhead_s"] = round(timings["verify_median_s"] - timings["nvidia_smi_median_s"], 3)
    gpu_node.results["timings"] = timings
    out = report_dir()
    out.mkdir(parents=True, exist_ok=True)
    (out / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    print(f"verify {timings['verify_median_s']}s vs nvidia-smi alone "
          f"{timings['nvidia_smi_median_s']}s (median of 3): {timings}")
    assert 0 < timings["nvidia_smi_median_s"] < 60 and 0 < timings["verify_median_s"] < 120
