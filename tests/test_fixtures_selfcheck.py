"""The fakes in tests/fixtures behave, and fail, like the things they replace.

If one of these fails, tests of the installer built on that fake prove nothing.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st

from tests.fixtures.kernel import fake_ko
from tests.fixtures.node import COS_BUILD_ID
from tests.fixtures.runfile import DEFAULT_VERSION, PREVIOUS_VERSION, build_driver_run
from tests.fixtures.sandbox import capture_writes
from tests.fixtures.server import ArtifactServer, parse_range

V = DEFAULT_VERSION
RELEASE = "5.15.0-1049-gke"


def run(argv, env=None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], env=env, capture_output=True, text=True,
                          timeout=60, **kwargs)


def write_ko(path: Path, name: str, **kwargs) -> Path:
    kwargs.setdefault("version", V)
    path.write_text(fake_ko(name, kwargs.pop("release", RELEASE), **kwargs))
    return path


@pytest.fixture
def nvidia_kos(tmp_path) -> dict[str, Path]:
    d = tmp_path / "drivers"
    d.mkdir()
    return {
        "nvidia": write_ko(d / "nvidia.ko", "nvidia"),
        "nvidia_uvm": write_ko(d / "nvidia-uvm.ko", "nvidia_uvm", depends=("nvidia",)),
        "nvidia_modeset": write_ko(d / "nvidia-modeset.ko", "nvidia_modeset",
                                   depends=("nvidia",)),
    }


@pytest.fixture
def extracted(driver_run, tmp_path) -> Path:
    target = tmp_path / "extract"
    result = run(["sh", driver_run.current, "-x", "--target", target])
    assert result.returncode == 0, result.stderr
    return target


# -- the .run archive ---------------------------------------------------------


def test_run_check_verifies_its_checksums(driver_run):
    result = run(["sh", driver_run.current, "--check"])
    assert result.returncode == 0
    assert "All good." in result.stdout
    assert "SHA256 checksums are OK" in result.stderr


def test_run_extract_only_gives_nvidia_layout(extracted):
    installer = extracted / "nvidia-installer"
    assert installer.is_file() and os.access(installer, os.X_OK)
    needed = run(["readelf", "-d", extracted / "nvidia-smi"]).stdout
    assert "Shared library: [libnvidia-ml.so.1]" in needed
    for lib, soname in ((f"libnvidia-ml.so.{V}", "libnvidia-ml.so.1"),
                        (f"libcuda.so.{V}", "libcuda.so.1")):
        assert f"Library soname: [{soname}]" in run(["readelf", "-d", extracted / lib]).stdout


def test_run_without_target_extracts_into_versioned_dir(driver_run, tmp_path):
    assert run(["sh", driver_run.current, "-x"], cwd=tmp_path).returncode == 0
    assert (tmp_path / f"NVIDIA-Linux-x86_64-{V}" / "nvidia-installer").is_file()


def test_truncated_run_fails_integrity_check(driver_run, tmp_path):
    bad = tmp_path / "bad.run"
    data = driver_run.current.read_bytes()
    bad.write_bytes(data[:-1000])
    result = run(["sh", bad, "-x", "--target", tmp_path / "out"])
    assert result.returncode == 2
    assert "Unexpected archive size" in result.stderr
    assert not (tmp_path / "out" / "nvidia-installer").exists()


def test_corrupted_run_fails_checksum(driver_run, tmp_path):
    bad = tmp_path / "bad.run"
    data = bytearray(driver_run.current.read_bytes())
    middle = len(data) - 5000
    data[middle:middle + 4] = bytes(b ^ 0xFF for b in data[middle:middle + 4])
    bad.write_bytes(bytes(data))
    result = run(["sh", bad, "--check"])
    assert result.returncode == 2
    assert "Error in SHA256 checksums" in result.stderr


def test_run_passes_unknown_flags_to_the_installer(driver_run):
    result = run(["sh", driver_run.current, "--silent", "--foo"])
    assert result.returncode == 1
    assert 'nvidia-installer: unrecognized option: "--foo"' in result.stderr
    assert "ERROR: Invalid commandline, please run `nvidia-installer --help`" in result.stderr


def test_runs_are_cached_and_versioned(driver_run, tmp_path):
    assert driver_run.previous.name == f"NVIDIA-Linux-x86_64-{PREVIOUS_VERSION}.run"
    copy = build_driver_run(tmp_path, V)
    assert copy != driver_run.current
    assert copy.read_bytes() == driver_run.current.read_bytes()


# -- nvidia-installer refusals ------------------------------------------------


@pytest.fixture
def installer(extracted, fake_kernel, ubuntu_node, tmp_path):
    """Run the extracted installer against the fake kernel; logs go to tmp."""
    log = tmp_path / "installer.log"

    def invoke(*args, env_extra=None):
        env = fake_kernel.subprocess_env()
        env.update(env_extra or {})
        result = run([extracted / "nvidia-installer", f"--log-file-name={log}", *args], env=env)
        result.log = log.read_text() if log.exists() else ""
        return result

    invoke.headers = ubuntu_node.headers_dir
    return invoke


SILENT = ("--silent", "--skip-module-load")


@pytest.mark.parametrize("args, message", [
    (("--foo",), 'nvidia-installer: unrecognized option: "--foo"'),
    (("--kernel-source-path",), 'option "--kernel-source-path" requires an argument.'),
    (("--accept-license",), "no terminal is available"),
    (("--ui=none", "--no-questions"), "You must accept the NVIDIA Software License"),
    ((*SILENT, "--kernel-source-path=/nonexistent"),
     "ERROR: Unable to find the kernel source tree for the currently running kernel."),
    ((*SILENT, "-m=kernel-closed"), "Invalid kernel module build directory 'kernel-closed'"),
])
def test_installer_refusals(installer, args, message):
    result = installer(*args)
    assert result.returncode == 1
    assert message in result.stderr


def test_installer_needs_headers_for_the_kernel_it_builds_for(installer):
    result = installer(*SILENT, f"--kernel-source-path={installer.headers}", "-k", "6.1.0-1-cloud")
    assert result.returncode == 1
    assert "Unable to find the kernel source tree" in result.stderr
    assert f"'{installer.headers}': release '{RELEASE}'" in result.log


def test_installer_reports_build_failure_in_log(installer):
    (installer.headers / ".fake-build-fails").touch()
    result = installer(*SILENT, f"--kernel-source-path={installer.headers}")
    assert result.returncode == 1
    assert "ERROR: Unable to build the NVIDIA kernel module." in result.stderr
    assert "nvidia/nv.c:1: error: implicit declaration of function" in result.log


def test_installer_refuses_while_nouveau_is_loaded(installer, fake_kernel):
    fake_kernel.load_nouveau()
    result = installer(*SILENT, f"--kernel-source-path={installer.headers}")
    assert result.returncode == 1
    assert "The Nouveau kernel driver is currently in use" in result.stderr
    # --no-nouveau-check gets past that check (to the next refusal).
    result = installer(*SILENT, "--no-nouveau-check", "--kernel-source-path=/nonexistent")
    assert "Unable to find the kernel source tree" in result.stderr


def test_installer_test_loads_through_insmod_without_skip_module_load(installer, fake_kernel):
    """Releases before 550.40.07 test-load what they built with the insmod on PATH
    (NVIDIA's kernel.c test_kernel_modules); a refused load fails the install."""
    fake_kernel.set_sig_enforce(True)
    result = installer("--silent", f"--kernel-source-path={installer.headers}")
    assert result.returncode == 1
    assert "ERROR: Unable to load the 'nvidia' kernel module." in result.stderr
    assert "insmod" in fake_kernel.call_log.read_text()


def test_installer_needs_a_compiler(installer):
    result = installer(*SILENT, f"--kernel-source-path={installer.headers}",
                       env_extra={"CC": "/nonexistent/gcc"})
    assert result.returncode == 1
    assert "Unable to find the system utility `/nonexistent/gcc`" in result.stderr


def test_older_installer_lacks_kernel_module_type(driver_run, tmp_path):
    target = tmp_path / "old"
    assert run(["sh", driver_run.previous, "-x", "--target", target]).returncode == 0
    result = run([target / "nvidia-installer", "--silent", "--kernel-module-type=open"])
    assert result.returncode == 1
    assert 'unrecognized option: "--kernel-module-type=open"' in result.stderr


def test_installer_refuses_to_write_the_real_root(extracted, fake_kernel):
    result = run([extracted / "nvidia-installer", "--silent", "--no-kernel-module"],
                 env=fake_kernel.subprocess_env())
    assert result.returncode == 3
    assert "refusing to write /var/log/nvidia-installer.log" in result.stderr
    assert not Path("/var/log/nvidia-installer.log").exists()


def test_installer_records_its_calls_with_exact_argv(installer, fake_kernel):
    installer("--foo", 'we"ird\\arg')
    [call] = fake_kernel.calls("nvidia-installer")
    assert call["argv"][1:] == ["--foo", 'we"ird\\arg'] and call["rc"] == 1


# -- nvidia-installer success, captured in a private mount namespace -----------


def installed_module(capture, path: str) -> dict[str, str]:
    lines = capture.path(path).read_text().splitlines()
    assert lines[0] == "FAKEKO1"
    return dict(line.split("=", 1) for line in lines[1:])


def test_install_writes_nvidias_fixed_paths(driver_run, fake_kernel, ubuntu_node, tmp_path):
    capture = capture_writes(
        ["sh", driver_run.current, "--silent", "--skip-module-load", "--no-questions",
         f"--kernel-source-path={ubuntu_node.headers_dir}", "-k", RELEASE],
        tmp_path / "capture", env=fake_kernel.subprocess_env())
    assert capture.returncode == 0, capture.stderr

    lib = "/usr/lib/x86_64-linux-gnu"
    video = os.path.realpath("/lib/modules") + f"/{RELEASE}/kernel/drivers/video"
    firmware = os.path.realpath("/lib/firmware")
    expected = {
        "/usr/bin/nvidia-smi", "/usr/bin/nvidia-modprobe", "/usr/bin/nvidia-debugdump",
        *(f"{lib}/{name}{suffix}" for name in ("libnvidia-ml", "libcuda")
          for suffix in (f".so.{V}", ".so.1", ".so")),
        *(f"{video}/{m}.ko" for m in ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm")),
        f"{firmware}/nvidia/{V}/gsp_ga10x.bin",
        "/etc/OpenCL/vendors/nvidia.icd", f"/usr/share/nvidia/nvidia-application-profiles-{V}-rc",
        "/var/log/nvidia-installer.log",
        "/etc/ld.so.cache", "/var/cache/ldconfig/aux-cache",  # the installer ran ldconfig
    }
    assert capture.written() == expected
    assert os.readlink(capture.path(f"{lib}/libnvidia-ml.so.1")) == f"libnvidia-ml.so.{V}"
    assert os.readlink(capture.path(f"{lib}/libcuda.so")) == "libcuda.so.1"
    assert capture.path("/usr/bin/nvidia-modprobe").stat().st_mode & 0o7777 == 0o4755

    drm = installed_module(capture, f"/lib/modules/{RELEASE}/kernel/drivers/video/nvidia-drm.ko")
    assert drm["vermagic"].split()[0] == RELEASE
    assert drm["depends"] == "nvidia-modeset,drm_kms_helper"
    assert (drm["version"], drm["signed"], drm["flavor"]) == (V, "no", "proprietary")
    log = capture.path("/var/log/nvidia-installer.log").read_text()
    assert "Installation of the NVIDIA Accelerated Graphics Driver" in log
    assert fake_kernel.calls("nvidia-installer")[-1]["rc"] == 0


def test_install_honours_prefixes_and_module_options(extracted, fake_kernel, ubuntu_node,
                                                     tmp_path):
    prefix, drivers = tmp_path / "nv", tmp_path / "drivers"
    key = tmp_path / "signing.key"
    key.write_text("fake key\n")
    capture = capture_writes(
        [extracted / "nvidia-installer", "--silent", "--skip-module-load",
         "--kernel-source-path", ubuntu_node.headers_dir,
         f"--utility-prefix={prefix}", "--utility-libdir=lib64", f"--opengl-prefix={prefix}",
         "--opengl-libdir=lib64", f"--kernel-install-path={drivers}", "--no-drm",
         "-m=kernel-open", f"--module-signing-secret-key={key}",
         f"--module-signing-public-key={key}"],
        tmp_path / "capture", env=fake_kernel.subprocess_env())
    assert capture.returncode == 0, capture.stderr
    assert (prefix / "bin/nvidia-smi").is_file()
    assert (prefix / "lib64/libnvidia-ml.so.1").is_symlink()
    assert (prefix / "lib64/libcuda.so.1").is_symlink()
    assert sorted(p.name for p in drivers.iterdir()) == [
        "nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia.ko"]
    info = dict(line.split("=", 1) for line in (drivers / "nvidia.ko").read_text().splitlines()[1:])
    assert (info["flavor"], info["signed"]) == ("open", "yes")
    # nvidia-modprobe ignores the prefix, as documented in DESIGN.md section 4.
    assert "/usr/bin/nvidia-modprobe" in capture.written()
    assert "/usr/bin/nvidia-smi" not in capture.written()


def test_installer_and_run_work_under_busybox(driver_run, fake_kernel, ubuntu_node, tmp_path):
    """Nothing but busybox applets on PATH: the .run and the installer still work."""
    bb = tmp_path / "bb"
    bb.mkdir()
    assert run(["busybox", "--install", "-s", bb]).returncode == 0
    env = {**fake_kernel.env(), "PATH": str(bb), "CC": shutil.which("gcc")}
    target = tmp_path / "x"
    result = run([bb / "sh", driver_run.current, "-x", "--target", target], env=env)
    assert result.returncode == 0, result.stderr
    capture = capture_writes(
        [bb / "sh", target / "nvidia-installer", "--silent", "--skip-module-load",
         f"--kernel-source-path={ubuntu_node.headers_dir}"], tmp_path / "capture", env=env)
    assert capture.returncode == 0, capture.stderr
    assert "/usr/bin/nvidia-smi" in capture.written()
    assert os.readlink(capture.path("/usr/lib/x86_64-linux-gnu/libcuda.so.1")) \
        == f"libcuda.so.{V}"
    assert fake_kernel.calls("nvidia-installer")[-1]["rc"] == 0


# -- ld cache and nvidia-smi ------------------------------------------------------


def test_ldconfig_resolves_libnvidia_ml_in_the_install_dir(driver_run, ubuntu_node):
    lib64 = ubuntu_node.install_dir / "lib64"
    lib64.mkdir()
    shutil.copy(driver_run.payload() / f"libnvidia-ml.so.{V}", lib64)
    conf = ubuntu_node.path("/etc/ld.so.conf.d/nvidia.conf")
    conf.write_text("/home/kubernetes/bin/nvidia/lib64\n")
    assert run(["ldconfig", "-r", ubuntu_node.root]).returncode == 0
    listing = run(["ldconfig", "-r", ubuntu_node.root, "-p"]).stdout
    assert ("libnvidia-ml.so.1 (libc6,x86-64) => /home/kubernetes/bin/nvidia/lib64/"
            "libnvidia-ml.so.1") in listing
    assert os.readlink(lib64 / "libnvidia-ml.so.1") == f"libnvidia-ml.so.{V}"


@pytest.fixture
def smi(driver_run, fake_kernel, tmp_path):
    """nvidia-smi from the payload with its library resolvable via LD_LIBRARY_PATH."""
    lib = tmp_path / "lib64"
    lib.mkdir()
    shutil.copy(driver_run.payload() / f"libnvidia-ml.so.{V}", lib)
    (lib / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{V}")

    def invoke(*args):
        env = fake_kernel.subprocess_env()
        env["LD_LIBRARY_PATH"] = str(lib)
        return run([driver_run.payload() / "nvidia-smi", *args], env=env)

    return invoke


def test_nvidia_smi_cannot_start_without_its_library(driver_run, fake_kernel):
    env = fake_kernel.subprocess_env()
    env.pop("LD_LIBRARY_PATH", None)
    result = run([driver_run.payload() / "nvidia-smi"], env=env)
    assert result.returncode == 127
    assert ("error while loading shared libraries: libnvidia-ml.so.1: cannot open shared "
            "object file") in result.stderr


def test_nvidia_smi_follows_the_driver_state(smi, fake_kernel, tmp_path):
    result = smi()
    assert result.returncode == 9
    assert result.stdout.startswith(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")

    old = write_ko(tmp_path / "old.ko", "nvidia", version=PREVIOUS_VERSION)
    assert run(["insmod", old], env=fake_kernel.subprocess_env()).returncode == 0
    result = smi()
    assert result.returncode == 18
    assert "Failed to initialize NVML: Driver/library version mismatch" in result.stdout

    env = fake_kernel.subprocess_env()
    assert run(["rmmod", "nvidia"], env=env).returncode == 0
    assert run(["insmod", write_ko(tmp_path / "new.ko", "nvidia")], env=env).returncode == 0
    result = smi()
    assert (result.returncode, result.stdout) == (6, "No devices were found\n")

    fake_kernel.add_gpu()
    fake_kernel.add_gpu("0000:00:05.0", "0x1eb8")
    result = smi()
    assert result.returncode == 0
    assert f"Driver Version: {V}" in result.stdout and "CUDA Version: 12.4" in result.stdout
    assert "NVIDIA L4" in result.stdout and "Tesla T4" in result.stdout
    result = smi("--query-gpu=name,driver_version,pci.bus_id", "--format=csv,noheader")
    assert result.stdout == (f"NVIDIA L4, {V}, 00000000:00:04.0\n"
                             f"Tesla T4, {V}, 00000000:00:05.0\n")
    assert smi("-pm", "1").stdout.startswith("Enabled Legacy persistence mode for GPU 0000")
    assert smi("--query-gpu=persistence_mode", "--format=csv,noheader").stdout \
        == "Enabled\nEnabled\n"
    # As root the user-space driver creates its own control and GPU nodes.
    assert fake_kernel.devices() == {"nvidiactl": (195, 255), "nvidia0": (195, 0),
                                     "nvidia1": (195, 1)}
    assert [c["rc"] for c in fake_kernel.calls("nvidia-smi")] == [9, 18, 6, 0, 0, 0, 0]


def test_libcuda_init_needs_module_uvm_and_gpu(driver_run, fake_kernel, nvidia_kos, monkeypatch):
    for key, value in fake_kernel.env().items():
        monkeypatch.setenv(key, value)
    cuda = ctypes.CDLL(str(driver_run.payload() / f"libcuda.so.{V}"))
    version = ctypes.c_int()
    assert cuda.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value == 12040
    assert cuda.cuInit(0) == 100          # CUDA_ERROR_NO_DEVICE: no driver
    env = fake_kernel.subprocess_env()
    run(["insmod", nvidia_kos["nvidia"]], env=env)
    assert cuda.cuInit(0) == 999          # CUDA_ERROR_UNKNOWN: nvidia_uvm missing
    run(["insmod", nvidia_kos["nvidia_uvm"]], env=env)
    fake_kernel.add_gpu()
    assert cuda.cuInit(0) == 0


# -- fake kmod ----------------------------------------------------------------------


def test_insmod_enforces_order_and_uniqueness(fake_kernel, nvidia_kos):
    env = fake_kernel.subprocess_env()
    uvm, nvidia = nvidia_kos["nvidia_uvm"], nvidia_kos["nvidia"]
    result = run(["insmod", uvm], env=env)
    assert (result.returncode, result.stderr) == (
        1, f"insmod: ERROR: could not insert module {uvm}: Unknown symbol in module\n")
    assert run(["insmod", nvidia, "NVreg_EnableGpuFirmware=0"], env=env).returncode == 0
    result = run(["insmod", nvidia], env=env)
    assert result.stderr == f"insmod: ERROR: could not insert module {nvidia}: File exists\n"
    assert run(["insmod", uvm], env=env).returncode == 0

    modules = (fake_kernel.proc_dir / "modules").read_text().splitlines()
    assert modules[0].startswith("nvidia_uvm ") and modules[0].endswith(
        " 0 - Live 0x0000000000000000 (POE)")
    assert modules[1].split()[2:4] == ["1", "nvidia_uvm,"]
    loaded = fake_kernel.loaded()
    assert loaded["nvidia"].params == {"NVreg_EnableGpuFirmware": "0"}
    assert loaded["nvidia"].version == V
    assert (fake_kernel.sys_dir / "module/nvidia/holders/nvidia_uvm").is_symlink()
    assert "Kernel Module  550.54.14  " in (
        fake_kernel.proc_dir / "driver/nvidia/version").read_text()
    assert [c["rc"] for c in fake_kernel.calls("insmod")] == [1, 0, 1, 0]


def test_rmmod_refuses_modules_in_use(fake_kernel, nvidia_kos):
    env = fake_kernel.subprocess_env()
    for name in ("nvidia", "nvidia_uvm", "nvidia_modeset"):
        assert run(["insmod", nvidia_kos[name]], env=env).returncode == 0
    result = run(["rmmod", "nvidia"], env=env)
    assert (result.returncode, result.stderr) == (
        1, "rmmod: ERROR: Module nvidia is in use by: nvidia_uvm nvidia_modeset\n")
    fake_kernel.hold("nvidia_uvm")
    result = run(["rmmod", "nvidia-uvm"], env=env)
    assert result.stderr == "rmmod: ERROR: Module nvidia_uvm is in use\n"
    fake_kernel.unhold("nvidia_uvm")
    assert run(["rmmod", "nvidia_uvm", "nvidia_modeset"], env=env).returncode == 0
    assert fake_kernel.loaded()["nvidia"].refcnt == 0
    assert run(["rmmod", "nvidia"], env=env).returncode == 0
    assert not (fake_kernel.proc_dir / "driver/nvidia").exists()
    result = run(["rmmod", "nvidia"], env=env)
    assert result.stderr == "rmmod: ERROR: Module nvidia is not currently loaded\n"


def test_kernel_rejects_unsigned_wrong_and_missing_modules(fake_kernel, tmp_path):
    env = fake_kernel.subprocess_env()
    ko = write_ko(tmp_path / "nvidia.ko", "nvidia")

    def insmod_error(path):
        result = run(["insmod", path], env=env)
        assert result.returncode == 1
        return result.stderr.rsplit(": ", 1)[-1].strip()

    fake_kernel.set_sig_enforce(True)
    assert insmod_error(ko) == "Key was rejected by service"
    fake_kernel.set_sig_enforce(False)
    fake_kernel.set_cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro module.sig_enforce=1")
    assert insmod_error(ko) == "Key was rejected by service"
    signed = write_ko(tmp_path / "signed.ko", "nvidia", signed=True)
    assert run(["insmod", signed], env=env).returncode == 0
    fake_kernel.set_cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro")
    fake_kernel.set_lockdown("integrity")
    assert insmod_error(write_ko(tmp_path / "uvm.ko", "nvidia_uvm")) == "Operation not permitted"
    fake_kernel.set_lockdown("none")

    other_kernel = write_ko(tmp_path / "old-kernel.ko", "nvidia_uvm", release="5.15.0-1048-gke")
    assert insmod_error(other_kernel) == "Invalid module format"
    elf = tmp_path / "real.ko"
    elf.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(64))
    assert insmod_error(elf) == "Invalid module format"
    result = run(["insmod", tmp_path / "missing.ko"], env=env)
    assert result.stderr == (f"insmod: ERROR: could not load module {tmp_path}/missing.ko: "
                             "No such file or directory\n")


def test_modprobe_resolves_modules_dep_under_a_root(fake_kernel, ubuntu_node):
    env = fake_kernel.subprocess_env()
    root = ubuntu_node.root
    assert run(["modprobe", "-d", root, "drm-kms-helper"], env=env).returncode == 0
    assert list(fake_kernel.loaded()) == ["drm_kms_helper", "drm"]
    result = run(["modprobe", "-d", root, "nvidia"], env=env)
    assert (result.returncode, result.stderr) == (
        1, f"modprobe: FATAL: Module nvidia not found in directory {root}/lib/modules/{RELEASE}\n")
    assert run(["modprobe", "-q", "-d", root, "nvidia"], env=env).stderr == ""
    result = run(["modprobe", "-r", "-d", root, "drm"], env=env)
    assert (result.returncode, result.stderr) == (1, "modprobe: FATAL: Module drm is in use.\n")
    assert run(["modprobe", "-r", "-d", root, "drm_kms_helper"], env=env).returncode == 0
    assert fake_kernel.loaded() == {}
    lsmod = run(["lsmod"], env=env)
    assert lsmod.stdout == "Module                  Size  Used by\n"


def test_concurrent_loads_keep_state_consistent(fake_kernel, tmp_path):
    env = fake_kernel.subprocess_env()
    kos = [write_ko(tmp_path / f"m{i}.ko", f"mod{i}") for i in range(6)]
    procs = [subprocess.Popen(["insmod", str(k)], env=env) for k in kos]
    assert [p.wait(timeout=30) for p in procs] == [0] * 6
    assert sorted(fake_kernel.loaded()) == [f"mod{i}" for i in range(6)]
    assert len(fake_kernel.calls("insmod")) == 6


def test_unload_all_is_a_reboot(fake_kernel, nvidia_kos):
    env = fake_kernel.subprocess_env()
    run(["insmod", nvidia_kos["nvidia"]], env=env)
    fake_kernel.add_gpu()
    assert run(["sh", "-c", f"mknod {fake_kernel.dev_dir}/nvidia0 c 195 0"]).returncode == 0
    fake_kernel.unload_all()
    assert fake_kernel.loaded() == {} and fake_kernel.devices() == {}
    assert not (fake_kernel.sys_dir / "module/nvidia").exists()


# -- nvidia-modprobe ------------------------------------------------------------------


def test_nvidia_modprobe_creates_nodes_for_loaded_modules(driver_run, fake_kernel, nvidia_kos):
    env = fake_kernel.subprocess_env()
    nvidia_modprobe = driver_run.payload() / "nvidia-modprobe"
    assert run([nvidia_modprobe, "-c0", "-u", "-m"], env=env).returncode == 1
    assert fake_kernel.devices() == {}
    for name in ("nvidia", "nvidia_uvm"):
        run(["insmod", nvidia_kos[name]], env=env)
    assert run([nvidia_modprobe, "-c0", "-u"], env=env).returncode == 0
    assert run([nvidia_modprobe, "-m"], env=env).returncode == 1   # modeset not loaded
    run(["insmod", nvidia_kos["nvidia_modeset"]], env=env)
    assert run([nvidia_modprobe, "-c", "1", "-m"], env=env).returncode == 0
    assert fake_kernel.devices() == {
        "nvidia-modeset": (195, 254), "nvidia-uvm": (511, 0), "nvidia-uvm-tools": (511, 1),
        "nvidia0": (195, 0), "nvidia1": (195, 1), "nvidiactl": (195, 255)}
    assert (fake_kernel.dev_dir / "nvidia-uvm").stat().st_mode & 0o777 == 0o666
    result = run([nvidia_modprobe, "--frobnicate"], env=env)
    assert result.returncode == 1 and 'unrecognized option: "--frobnicate"' in result.stderr
    assert [c["argv"] for c in fake_kernel.calls("nvidia-modprobe")][:2] == [
        ["-c0", "-u", "-m"], ["-c0", "-u"]]


# -- artifact server ----------------------------------------------------------------------

PAYLOAD = bytes(range(256)) * 1024


def test_server_tls_range_head_and_404(artifact_server):
    srv = artifact_server
    url = srv.serve("/550/driver.run", PAYLOAD)
    verify = srv.ca_bundle_path
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(url, timeout=10)
    assert requests.get(url, verify=verify, timeout=10).content == PAYLOAD
    part = requests.get(url, verify=verify, timeout=10, headers={"Range": "bytes=1000-"})
    assert part.status_code == 206 and part.content == PAYLOAD[1000:]
    assert part.headers["Content-Range"] == f"bytes 1000-{len(PAYLOAD) - 1}/{len(PAYLOAD)}"
    stale = requests.get(url, verify=verify, timeout=10,
                         headers={"Range": "bytes=1000-", "If-Range": '"other"'})
    assert stale.status_code == 200
    beyond = requests.get(url, verify=verify, timeout=10, headers={"Range": "bytes=999999-"})
    assert beyond.status_code == 416
    head = requests.head(url, verify=verify, timeout=10)
    assert head.status_code == 200 and head.headers["Content-Length"] == str(len(PAYLOAD))
    assert requests.get(srv.url_for("/missing"), verify=verify, timeout=10).status_code == 404
    assert [r.status for r in srv.requests_for("/550/driver.run")] == [200, 206, 200, 416, 200]


def test_server_faults_then_resume(artifact_server):
    srv = artifact_server
    url = srv.serve("/driver.run", PAYLOAD)
    srv.fault("/driver.run", statuses=[503, 503], drop_after=100_000)
    get = lambda **kw: requests.get(url, verify=srv.ca_bundle_path, timeout=10, **kw)  # noqa: E731
    assert [get().status_code, get().status_code] == [503, 503]
    received = b""
    with pytest.raises(requests.exceptions.ChunkedEncodingError), get(stream=True) as response:
        for chunk in response.iter_content(8192):
            received += chunk
    assert srv.requests[-1].body_bytes == 100_000 and 0 < len(received) <= 100_000
    rest = get(headers={"Range": f"bytes={len(received)}-"})
    assert rest.status_code == 206
    assert hashlib.sha256(received + rest.content).digest() == hashlib.sha256(PAYLOAD).digest()


def test_server_rate_limit_and_plain_http():
    with ArtifactServer(tls=False) as srv:
        url = srv.serve("/slow", b"x" * 20_000)
        srv.fault("/slow", rate=100_000)
        started = time.monotonic()
        response = requests.get(url, timeout=10)
        assert time.monotonic() - started >= 0.15     # 20 kB at 100 kB/s
        assert url.startswith("http://127.0.0.1:") and response.content == b"x" * 20_000
        assert srv.requests[-1].body_bytes == 20_000


@given(size=st.integers(1, 5000), first=st.integers(0, 6000), last=st.integers(0, 6000) | st.none())
def test_parse_range_matches_rfc_9110(size, first, last):
    header = f"bytes={first}-{'' if last is None else last}"
    span = parse_range(header, size)
    if first >= size:
        assert span is False
    elif last is not None and last < first:
        assert span is None
    else:
        assert span == (first, min(size - 1, size - 1 if last is None else last))


# -- node trees -----------------------------------------------------------------------------


def test_ubuntu_node_tree(ubuntu_node):
    os_release = ubuntu_node.path("/etc/os-release").read_text()
    assert 'PRETTY_NAME="Ubuntu 22.04.4 LTS"' in os_release and "\nID=ubuntu\n" in os_release
    build = ubuntu_node.modules_dir / "build"
    assert os.readlink(build) == f"/usr/src/linux-headers-{RELEASE}"   # absolute, as shipped
    assert (ubuntu_node.headers_dir / "include/config/kernel.release").read_text().strip() \
        == RELEASE
    assert "kernel/drivers/gpu/drm/drm_kms_helper.ko: kernel/drivers/gpu/drm/drm.ko" in (
        ubuntu_node.modules_dir / "modules.dep").read_text()
    assert ubuntu_node.path("/etc/ld.so.conf").read_text().startswith(
        "include /etc/ld.so.conf.d/*.conf")


def test_cos_node_tree(cos_node):
    assert f"BUILD_ID={COS_BUILD_ID}\n" in cos_node.path("/etc/os-release").read_text()
    assert "CHROMEOS_RELEASE_BOARD=lakitu\n" in cos_node.path("/etc/lsb-release").read_text()
    assert cos_node.headers_dir is None
    assert not (cos_node.modules_dir / "build").exists()


def test_fake_kernel_env_names_the_seams(fake_kernel):
    env = fake_kernel.env()
    assert set(env) == {"NVIDIA_INSTALLER_PROC_DIR", "NVIDIA_INSTALLER_SYS_DIR",
                        "NVIDIA_INSTALLER_DEV_DIR", "FAKE_CALL_LOG"}
    assert Path(env["NVIDIA_INSTALLER_PROC_DIR"], "sys/kernel/osrelease").read_text() \
        == RELEASE + "\n"
    assert Path(env["NVIDIA_INSTALLER_PROC_DIR"], "cmdline").read_text() \
        == "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro\n"
    assert fake_kernel.calls() == []
