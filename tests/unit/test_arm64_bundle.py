"""Bundles for an Arm fleet built on an amd64 machine (issue 42 §2): ``bundle build --arch
arm64`` plans NVIDIA's aarch64 .run and a Kbuild cross build, the bundle records its
architecture, and a node refuses a bundle of another architecture (exit 6, one line)
before anything is staged. The real cross build: tests/arm64 (``make test-arm64``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from installer.base import cpuarch
from installer.base.errors import (
    BuildError,
    ExitCode,
    IntegrityError,
    UnsupportedHostError,
    UsageError,
)
from installer.bundle.fetch import unpack
from installer.commands import bundle_build as build
from installer.commands.bundle_cli import bundle
from installer.detect import context
from installer.driver import nvidia_run
from installer.host.installdir import Tree
from installer.records.bundle_manifest import BundleError, Manifest
from installer.settings import Settings, validate
from tests.fixtures.kernel import FakeKernel
from tests.fixtures.node import UBUNTU_KERNEL, build_ubuntu_node
from tests.unit.test_bundle import KEY, R, layout, manifest_doc

V = "535.261.03"
# This machine's Debian qemu-user-static registration as /proc/sys/fs/binfmt_misc shows
# it (qemu's scripts/qemu-binfmt-conf.sh: aarch64_magic and aarch64_mask).
QEMU_AARCH64 = """enabled
interpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P
flags: POF
offset 0
magic 7f454c460201010000000000000000000200b700
mask ffffffffffffff00fffffffffffffffffeffffff
"""


def elf_head(machine: int, elf_type: int = 2) -> bytes:
    """The first 64 bytes of a little-endian ELF64 file (e_type, e_machine)."""
    ident = b"\x7fELF\x02\x01\x01" + bytes(9)
    return (ident + elf_type.to_bytes(2, "little") + machine.to_bytes(2, "little")).ljust(64, b"\0")


AARCH64_EXEC, X86_64_EXEC = elf_head(183), elf_head(62)


def to_aarch64(ko: Path) -> None:
    """A fixture module (elfmod: EM_X86_64) made an aarch64 one: e_machine at offset 18."""
    data = bytearray(ko.read_bytes())
    data[18:20] = (183).to_bytes(2, "little")
    ko.write_bytes(bytes(data))


@pytest.fixture
def build_machine(tmp_path, monkeypatch):
    """An x86_64 build machine (the fake kernel's machine) with Ubuntu's headers."""
    node = build_ubuntu_node(tmp_path / "node")
    kernel = FakeKernel(tmp_path / "kernel", UBUNTU_KERNEL)
    kernel.set_machine("x86_64")
    kernel.activate(monkeypatch)

    def ctx(arch: cpuarch.CpuArch | None = None, **settings):
        settings.setdefault("driver_base_url", "https://127.0.0.1:1/tesla")
        return context(validate(Settings(host_root=node.root, install_dir=node.install_dir,
                                         driver_version=V, **settings)), arch=arch)

    return ctx


def steps(plan) -> dict[str, str]:
    return {s.name: s.detail for s in plan.steps}


def test_an_arm64_bundle_on_an_x86_64_machine_plans_the_aarch64_run_and_a_cross_make(
        build_machine, tmp_path):
    plan = build.plan(build_machine(cpuarch.AARCH64), tmp_path / "out", None)
    assert plan.summary["driver_url"] == (
        f"https://127.0.0.1:1/tesla/{V}/NVIDIA-Linux-aarch64-{V}.run")
    make = steps(plan)["build_driver"]
    assert " ARCH=arm64 CROSS_COMPILE=aarch64-linux-gnu- modules; then " in make
    assert plan.display["arch"] == "aarch64" and plan.display["cross_compiled"] is True


def test_a_native_bundle_plans_as_before(build_machine, tmp_path):
    for arch in (None, cpuarch.X86_64):  # no --arch, or this machine's own
        plan = build.plan(build_machine(arch), tmp_path / "out", None)
        assert plan.summary["driver_url"].endswith(f"/NVIDIA-Linux-x86_64-{V}.run")
        assert "ARCH=" not in steps(plan)["build_driver"]
        assert plan.display["cross_compiled"] is False


def test_an_arm64_bundle_refuses_an_x86_64_driver_url(build_machine):
    url = f"https://127.0.0.1:1/m/NVIDIA-Linux-x86_64-{V}.run"
    with pytest.raises(UsageError, match="names an x86_64 driver, and this node is aarch64"):
        build_machine(cpuarch.AARCH64, driver_url=url, driver_base_url=None)


def test_arch_takes_unames_and_dpkgs_names_and_nothing_else():
    result = CliRunner().invoke(bundle, ["build", "--output-dir", "/nonexistent/x",
                                         "--arch", "ppc64le"])
    assert result.exit_code == ExitCode.USAGE == 2
    assert "'ppc64le' is not one of 'x86_64', 'amd64', 'aarch64', 'arm64'" in result.output


def test_binfmt_matching_is_the_kernels_magic_under_mask():
    assert cpuarch.binfmt_runs(QEMU_AARCH64, AARCH64_EXEC)
    assert cpuarch.binfmt_runs(QEMU_AARCH64, elf_head(183, elf_type=3))  # PIE: ET_DYN (mask fe)
    assert not cpuarch.binfmt_runs(QEMU_AARCH64, X86_64_EXEC)
    assert not cpuarch.binfmt_runs(QEMU_AARCH64.replace("enabled", "disabled"), AARCH64_EXEC)
    assert not cpuarch.binfmt_runs("enabled\ninterpreter /x\nflags: \nextension .exe\n",
                                   AARCH64_EXEC)
    assert not cpuarch.binfmt_runs(QEMU_AARCH64.replace("b700", "zz"), AARCH64_EXEC)
    assert cpuarch.elf_arch(AARCH64_EXEC) is cpuarch.AARCH64
    assert cpuarch.elf_arch(b"#!/usr/bin/python3\n") is None


def program(tmp_path: Path, head: bytes) -> Path:
    path = tmp_path / "extract/nvidia-installer"
    path.parent.mkdir(parents=True)
    path.write_bytes(head + b"rest")
    return path


def test_a_cross_build_needs_a_binfmt_entry_for_the_runs_nvidia_installer(tmp_path):
    """Checked before make: the aarch64 .run's nvidia-installer runs after the build."""
    binfmt = tmp_path / "binfmt_misc"
    binfmt.mkdir()
    (binfmt / "status").write_text("enabled\n")
    installer = program(tmp_path, AARCH64_EXEC)
    with pytest.raises(BuildError) as exc:
        nvidia_run.check_runs_here(installer, cpuarch.X86_64, binfmt)
    assert exc.value.exit_code == ExitCode.BUILD == 7
    assert str(exc.value) == ("nvidia-installer of the .run is an aarch64 binary and this "
                              "x86_64 machine cannot run it (no binfmt_misc entry for aarch64)")
    assert "qemu-user-static" in exc.value.hint
    (binfmt / "qemu-aarch64").write_text(QEMU_AARCH64)
    nvidia_run.check_runs_here(installer, cpuarch.X86_64, binfmt)  # qemu-user runs it
    nvidia_run.check_runs_here(installer, cpuarch.AARCH64, tmp_path / "none")  # native


def test_a_script_installer_needs_no_binfmt(tmp_path):
    script = program(tmp_path, b"#!/usr/bin/python3\n")
    nvidia_run.check_runs_here(script, cpuarch.X86_64, tmp_path / "none")


def test_the_manifest_records_the_architecture_and_an_old_one_is_x86_64():
    doc = json.loads(manifest_doc())
    assert doc["arch"] == "x86_64"
    del doc["arch"]  # a bundle written before issue 42: x86_64, the only one built then
    assert Manifest.from_json(json.dumps(doc).encode()).arch == "x86_64"
    with pytest.raises(BundleError, match="arch 'sparc' is not one of x86_64, aarch64"):
        Manifest.from_json(manifest_doc(arch="sparc"))


def arm64_bundle(tmp_path: Path):
    root = layout(tmp_path / "built")
    for ko in (root / "drivers").glob("*.ko"):
        to_aarch64(ko)
    manifest = build.make_manifest(root, KEY, compiler="aarch64-linux-gnu-gcc (Debian) 12",
                                   signed=False, driver_sha256=None, arch=cpuarch.AARCH64)
    return build.write(root, manifest, tmp_path / "out")


def staging(tmp_path: Path, name: str) -> Tree:
    tree = Tree(tmp_path / name)
    tree.root.mkdir()
    return tree


def test_an_x86_64_node_refuses_an_arm64_bundle_in_one_line_with_exit_6(tmp_path):
    written = arm64_bundle(tmp_path)
    assert written.manifest.arch == "aarch64"
    assert written.manifest.summary()["arch"] == "aarch64"  # what the index keeps
    stage = staging(tmp_path, "x86")
    with pytest.raises(IntegrityError) as exc:
        unpack(written.path, stage, KEY, R, arch="x86_64")
    assert exc.value.exit_code == ExitCode.INTEGRITY == 6
    assert str(exc.value) == (f"prebuilt bundle {KEY.name()} is built for aarch64, this node "
                              "is x86_64; nothing was installed")
    assert "\n" not in str(exc.value) and not list(stage.root.iterdir())
    arm = staging(tmp_path, "arm")
    assert unpack(written.path, arm, KEY, R, arch="aarch64").arch == "aarch64"
    assert (arm.root / "drivers/nvidia.ko").is_file()


def test_a_build_whose_modules_are_another_machines_is_refused(tmp_path):
    """The manifest's word is the modules' own ELF machine, checked when it is written."""
    root = layout(tmp_path / "built")
    to_aarch64(root / "drivers/nvidia-uvm.ko")
    with pytest.raises(BuildError, match=r"nvidia-uvm.ko is built for aarch64, not x86_64"):
        build.make_manifest(root, KEY, compiler="cc", signed=False, driver_sha256=None)


def test_a_driver_url_alone_is_not_taken_for_two_places(tmp_path):
    """--driver-base-url had a click default, so every --driver-url was 'both name where
    the .run comes from' (exit 2): bundle build could not take a .run's full URL."""
    result = CliRunner().invoke(bundle, [
        "build", "--output-dir", str(tmp_path / "out"), "--host-root", str(tmp_path),
        "--driver-url", f"https://127.0.0.1:1/m/NVIDIA-Linux-aarch64-{V}.run",
        "--arch", "arm64", "--kernel-release", "6.1.0-50-arm64"])
    # The run got past the options to the host: no os-release under tmp_path (exit 3).
    assert isinstance(result.exception, UnsupportedHostError), result.exception
    assert result.exception.exit_code == ExitCode.UNSUPPORTED_HOST


def test_the_compression_level_is_zstds_range():
    """--compression-level: a CI building for a fleet may trade size for time (the arm64
    tier's bundles use 3); zstd's levels are 1-22."""
    result = CliRunner().invoke(bundle, ["build", "--output-dir", "/nonexistent/x",
                                         "--compression-level", "23"])
    assert result.exit_code == ExitCode.USAGE
    assert "23 is not in the range 1<=x<=22" in result.output
