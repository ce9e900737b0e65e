"""NVIDIA's real driver parts, packed as .run files, behave like NVIDIA's.

The first run downloads about 140 MB and compiles NVIDIA's 535 modules directly
(about 2 minutes on 2 cores); everything is cached, so a rerun takes seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.nvidia_options import option_table
from tests.realparts import kbuild, standin
from tests.realparts.provision import RealParts

pytestmark = pytest.mark.realparts

INVALID = "ERROR: Invalid commandline, please run `./nvidia-installer --help` for usage information."


def installer(pkg: Path, *args: str) -> subprocess.CompletedProcess:
    """./nvidia-installer ARGS in the extracted package, as NVIDIA's .run runs it."""
    return subprocess.run(["./nvidia-installer", *args], cwd=pkg, capture_output=True, text=True, timeout=60)


# ------------------------------------------------------------ (a) options


def test_535_refuses_skip_module_load_like_nvidias(pkg_main: Path) -> None:
    cp = installer(pkg_main, "--skip-module-load")
    assert cp.returncode == 1
    # nvgetopt.c on stderr, then nv_error_msg framed by blank lines (stderr is not a tty)
    assert cp.stderr == f'./nvidia-installer: unrecognized option: "--skip-module-load"\n\n{INVALID}\n\n'
    assert cp.stdout == ""


def test_535_refuses_through_the_run_file(run_main: Path, tmp_path: Path) -> None:
    """The .run's header hands flags it does not know to nvidia-installer, as NVIDIA's does."""
    cp = subprocess.run(["sh", str(run_main), "--skip-module-load"], cwd=tmp_path,
                        capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert cp.returncode == 1
    refusal = f'./nvidia-installer: unrecognized option: "--skip-module-load"\n\n{INVALID}\n\n'
    assert cp.stderr.endswith(refusal)


def test_535_accepts_no_systemd(pkg_main: Path) -> None:
    # options are acted on in order: --version exits 0 once --no-systemd was accepted
    cp = installer(pkg_main, "--no-systemd", "--no-kernel-modules", "-j8", "-sq", "--version")
    assert (cp.returncode, cp.stderr) == (0, "")
    assert "nvidia-installer:  version 535.261.03" in cp.stdout.splitlines()


def test_470_refuses_kernel_module_type(pkg_legacy: Path, real_parts: RealParts) -> None:
    cp = installer(pkg_legacy, "--kernel-module-type=open")
    assert cp.returncode == 1
    # nvgetopt prints the argument cut at its '='
    assert cp.stderr == f'./nvidia-installer: unrecognized option: "--kernel-module-type"\n\n{INVALID}\n\n'
    ok = installer(pkg_legacy, "--no-systemd", "-m", "kernel", "--version")
    assert ok.returncode == 0 and f"version {real_parts.legacy.version}" in ok.stdout


def test_550_takes_its_own_option_table(pkg_r550: Path, real_parts: RealParts) -> None:
    """550 is the first branch with --skip-module-load (550.40.07) and has no
    --kernel-module-type (560.28.03): its stand-in accepts and refuses exactly that."""
    assert option_table(real_parts.r550.version)["release"].startswith("550.")
    ok = installer(pkg_r550, "--skip-module-load", "--no-kernel-modules", "--version")
    assert (ok.returncode, ok.stderr) == (0, "")
    assert f"nvidia-installer:  version {real_parts.r550.version}" in ok.stdout.splitlines()
    cp = installer(pkg_r550, "--kernel-module-type=open")
    assert cp.returncode == 1
    assert cp.stderr == f'./nvidia-installer: unrecognized option: "--kernel-module-type"\n\n{INVALID}\n\n'


@pytest.mark.parametrize(
    ("args", "first_line"),
    [
        (["--systemd=yes"], './nvidia-installer: option "--systemd" does not take an argument, '
                            'but was given an argument of "yes".'),
        (["--kernel-name="], './nvidia-installer: option "--kernel-name" requires an argument.'),
        (["-j", "two"], './nvidia-installer: "two" is not a valid argument for option "-j".'),
        (["-ks"], './nvidia-installer: unrecognized option: "-ks"'),
        (["--no-no-drm"], './nvidia-installer: unrecognized option: "--no-no-drm"'),
        (["install"], './nvidia-installer: invalid option: "install"'),
    ],
)
def test_535_command_line_errors_are_nvgetopts(pkg_main: Path, args: list[str], first_line: str) -> None:
    cp = installer(pkg_main, *args)
    assert cp.returncode == 1
    assert cp.stderr == f"{first_line}\n\n{INVALID}\n\n"


def test_option_table_is_the_releases_own_or_its_branchs_latest() -> None:
    assert option_table("535.261.03")["release"] == "535.261.03"
    assert option_table("535.300.01")["release"] == "535.261.03"
    assert option_table("560.35.03")["release"] == "555.42.02"
    assert option_table("470.256.02")["release"] == "470.256.02"


def test_standin_needs_libc_headers_to_build_modules(pkg_main: Path, pkg_legacy: Path,
                                                     tmp_path: Path) -> None:
    """misc.c check_development_tools: without /usr/include/stdio.h (a private mount
    namespace hides it) nvidia-installer refuses before it runs make; --no-kernel-modules
    never checks (tests/fixtures/test_selfcheck.py checks the payload stand-in the same way)."""
    for pkg in (pkg_main, pkg_legacy):
        log = tmp_path / f"{pkg.name}.log"
        cp = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs none /usr/include && exec "$@"', "sh", "./nvidia-installer",
             "--silent", f"--log-file-name={log}", f"--kernel-install-path={tmp_path / pkg.name}"],
            cwd=pkg, capture_output=True, text=True, timeout=120)
        assert cp.returncode == 1, cp.stderr
        assert "ERROR: You do not appear to have libc header files installed on your system." in (
            cp.stderr)
        assert "executing: 'cd" not in log.read_text()  # make never ran


# ------------------------------------------------------------ (b) archive


def test_run_extracts_nvidias_layout(pkg_main: Path, pkg_legacy: Path, real_parts: RealParts) -> None:
    """pkg_*: what ``sh NVIDIA-Linux-x86_64-<V>.run -x --target DIR`` extracted."""
    v = real_parts.main.version
    for rel in ("kernel/Kbuild", "kernel/Makefile", "kernel/conftest.sh", "kernel/nvidia/nv-kernel.o_binary",
                "kernel-open/Kbuild", "kernel-open/conftest.sh", "firmware/gsp_ga10x.bin",
                "firmware/gsp_tu10x.bin", f"libnvidia-ml.so.{v}", "nvidia-smi", "nvidia-modprobe"):
        assert (pkg_main / rel).is_file(), rel
    assert not (pkg_main / "kernel/debian").exists()  # Debian's packaging dir: not in NVIDIA's .run
    assert (pkg_main / ".version").read_text().strip() == v
    assert os.access(pkg_main / "nvidia-installer", os.X_OK)
    dyn = subprocess.run(["readelf", "-d", str(pkg_main / f"libnvidia-ml.so.{v}")], capture_output=True,
                         text=True)
    assert "Library soname: [libnvidia-ml.so.1]" in dyn.stdout

    for pkg in (pkg_main, pkg_legacy):  # Debian's nvidia-modprobe: NVIDIA's code, no stand-in
        assert (pkg / "nvidia-modprobe").read_bytes()[:4] == b"\x7fELF", pkg

    assert (pkg_legacy / "kernel/nvidia/nv-kernel.o_binary").is_file()
    assert not (pkg_legacy / "kernel-open").exists() and not (pkg_legacy / "firmware").exists()
    assert (pkg_legacy / ".version").read_text().strip() == real_parts.legacy.version


def test_run_checks_itself_and_refuses_a_truncated_copy(run_legacy: Path, tmp_path: Path) -> None:
    good = subprocess.run(["sh", str(run_legacy), "--check"], capture_output=True, text=True)
    assert good.returncode == 0 and "All good." in good.stdout
    cut = tmp_path / run_legacy.name
    cut.write_bytes(run_legacy.read_bytes()[:-1000])
    for args in (["--check"], ["-x", "--target", str(tmp_path / "x")]):
        bad = subprocess.run(["sh", str(cut), *args], capture_output=True, text=True)
        assert bad.returncode != 0 and "Unexpected archive size." in bad.stdout + bad.stderr, args
    assert not (tmp_path / "x" / "nvidia-installer").exists()


# ------------------------------------------------------------ (c) direct build


@pytest.mark.timeout(900)
def test_direct_build_with_split_headers(real_parts: RealParts, headers: kbuild.Headers) -> None:
    """kbuild as NVIDIA's Makefile drives it with the split Debian headers: conftest runs
    in full and one object of each module compiles with every probed flag.

    Only those objects are built (kbuild.cached_objects), not the modules: the modules of
    NVIDIA's whole build (all five, their version, vermagic and depends) are checked on the
    installer's own build of this tree (test_through_installer.py,
    test_real_535_proprietary_built_through_the_sandbox), which the guests then load."""
    built = kbuild.cached_objects(real_parts.main.kernel, headers, kbuild.COMPARED_OBJECTS)
    assert (built / kbuild.STATUS).read_text().strip() == "0"
    for h in ("headers.h", "functions.h", "symbols.h", "types.h", "generic.h", "macros.h"):
        assert (built / "conftest" / h).is_file(), h
    assert "#define NV_" in (built / "conftest/functions.h").read_text()  # its compile tests ran
    assert f'"{headers.abi}"' in (built / "conftest/uts_release").read_text()
    for obj in kbuild.COMPARED_OBJECTS:
        flags = kbuild.cmd_flags(built, obj)
        assert [f for f in kbuild.PROBED_FLAGS if f not in flags] == [], obj
        assert not any(str(built) in f for f in flags), obj  # normalised: comparable across dirs
    assert not list(built.glob("*.ko"))  # no module: only the objects were asked for


@pytest.mark.timeout(900)
def test_direct_build_without_the_output_dir_fails_in_conftest(real_parts: RealParts,
                                                               headers: kbuild.Headers) -> None:
    """SYSSRC=<arch dir> alone: NVIDIA's Makefile then takes it as the output dir too."""
    failed = kbuild.cached_build(real_parts.main.kernel, headers, source=headers.output,
                                 output=headers.output, allow_failure=True)
    assert (failed / kbuild.STATUS).read_text().strip() != "0"
    log = (failed / kbuild.BUILD_LOG).read_text(errors="replace")
    assert "conftest failed" in log or "stdarg.h: No such file" in log, log[-3000:]
    assert not (failed / "nvidia.ko").exists()


# ------------------------------------------------------------ (d) the stand-in builds


@pytest.mark.timeout(900)
def test_standin_with_only_the_output_dir_as_source_fails(run_main: Path, headers: kbuild.Headers) -> None:
    """NVIDIA's check (kernel.c determine_kernel_source_path): the arch dir has no linux/kernel.h."""
    work = standin.cached_install(run_main, headers, headers.output, None)
    res = standin.result(work)
    assert res["rc"] == 1
    errors = [line for line in res["stderr"].splitlines() if line.startswith("ERROR: ")]
    assert errors[0].startswith(f"ERROR: The kernel header file '{headers.output}/include/linux/kernel.h' "
                                "does not exist.")
    assert re.match(r"ERROR: Installation has failed\.  Please see the file '\S+/nvidia-installer.log'",
                    errors[-1])
    assert not list((work / "upper/usr").rglob("*nvidia*"))  # nothing installed
