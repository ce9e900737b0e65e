"""GPU detection from a fake sysfs, branch limits, fallback, open vs proprietary."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import structlog.testing

from installer.base.errors import ExitCode, UsageError
from installer.host import gpus
from installer.kmod.kernel import KernelState
from installer.settings import Settings
from installer.steps.checks import check_gpus


def add_pci(sys_dir: Path, addr: str, device: str, *, vendor: str = "0x10de",
            pci_class: str = "0x030200") -> None:
    base = sys_dir / "bus/pci/devices" / addr
    base.mkdir(parents=True)
    for name, value in (("vendor", vendor), ("device", device), ("class", pci_class),
                        ("subsystem_device", "0x1234")):
        (base / name).write_text(value + "\n")


def scan_of(tmp_path: Path, *devices: str) -> list[gpus.PciGpu]:
    for i, dev in enumerate(devices):
        add_pci(tmp_path, f"0000:00:{4 + i:02x}.0", dev)
    return gpus.scan(tmp_path)


def test_scan_keeps_nvidia_display_controllers_only(tmp_path):
    add_pci(tmp_path, "0000:00:04.0", "0x27b8")                       # L4, 3D controller
    add_pci(tmp_path, "0000:00:05.0", "0x1eb8", pci_class="0x030000")  # T4 as VGA
    add_pci(tmp_path, "0000:00:06.0", "0x1af1", vendor="0x1af4")       # virtio: not NVIDIA
    add_pci(tmp_path, "0000:00:07.0", "0x22a3", pci_class="0x068000")  # NVSwitch bridge
    add_pci(tmp_path, "0000:00:08.0", "0x10f0", pci_class="0x040300")  # HDMI audio function
    found = gpus.scan(tmp_path)
    assert [(g.address, g.name) for g in found] == [
        ("0000:00:04.0", "NVIDIA L4"), ("0000:00:05.0", "Tesla T4")]
    assert found[0].model.arch == "Ada Lovelace"


def test_scan_without_pci_tree_is_empty(tmp_path):
    assert gpus.scan(tmp_path / "nope") == []


def test_unknown_device_is_named_by_id_and_unconstrained(tmp_path):
    found = scan_of(tmp_path, "0xffff")
    assert found[0].name == "unknown NVIDIA GPU (PCI id 10de:ffff)"
    assert gpus.branch_problems(found, "390.157") == []
    assert gpus.allowed_branches(found) == (0, None)


@pytest.mark.parametrize(("device", "version", "fragment"), [
    ("0x102d", "550.54.14", "too new for Tesla K80 at 0000:00:04.0: Kepler GPUs need R470 or older"),
    ("0x27b8", "470.256.02", "too old for NVIDIA L4 at 0000:00:04.0: it needs R525 or newer"),
    ("0x2330", "515.105.01", "too old for NVIDIA H100 80GB HBM3"),
    ("0x2901", "550.54.14", "too old for NVIDIA B200"),
    ("0x1db4", "590.44.01", "too new for Tesla V100-PCIE-16GB"),
])
def test_branch_problems_name_gpu_and_allowed_branches(tmp_path, device, version, fragment):
    problems = gpus.branch_problems(scan_of(tmp_path, device), version)
    assert len(problems) == 1 and fragment in problems[0]


@pytest.mark.parametrize(("device", "version"), [
    ("0x102d", "470.256.02"), ("0x27b8", "525.60.13"), ("0x2330", "550.54.14"),
    ("0x1eb8", "410.104"), ("0x1db4", "580.65.06"),
])
def test_supported_combinations_have_no_problems(tmp_path, device, version):
    assert gpus.branch_problems(scan_of(tmp_path, device), version) == []


def test_alias_versions_are_not_judged(tmp_path):
    assert gpus.branch_problems(scan_of(tmp_path, "0x102d"), "default") == []
    assert gpus.branch_of("R535") is None and gpus.branch_of("535.183.01") == 535


def test_default_falls_back_to_a_branch_the_gpu_supports(tmp_path):
    k80 = scan_of(tmp_path, "0x102d")
    version, why = gpus.pick_default(k80, "550.127.05")
    assert version == "470.256.02"
    assert "Tesla K80" in why and "550.127.05" in why


def test_default_kept_when_supported(tmp_path):
    assert gpus.pick_default(scan_of(tmp_path, "0x27b8"), "550.127.05") == ("550.127.05", None)


def test_blackwell_default_moves_to_a_newer_branch(tmp_path):
    version, why = gpus.pick_default(scan_of(tmp_path, "0x2901"), "550.127.05")
    assert gpus.branch_of(version) >= 570 and why


def test_gpus_without_a_common_branch(tmp_path):
    mixed = scan_of(tmp_path, "0x102d", "0x27b8")  # K80 <= R470, L4 >= R525
    assert gpus.allowed_branches(mixed) == (525, 470)
    assert gpus.describe_range(525, 470).startswith("none")
    assert gpus.pick_default(mixed, "550.127.05") == ("550.127.05", None)


@pytest.mark.parametrize(("devices", "version", "requested", "expected", "n_problems"), [
    (["0x102d"], "470.256.02", "auto", "proprietary", 0),
    (["0x1eb8"], "550.54.14", "auto", "proprietary", 0),   # Turing, before R560's default
    (["0x1eb8"], "570.133.20", "auto", "open", 0),         # Turing, R560+ default is open
    (["0x2901"], "570.133.20", "auto", "open", 0),         # Blackwell requires open
    (["0x2901"], "570.133.20", "proprietary", "proprietary", 1),
    (["0x102d"], "470.256.02", "open", "open", 2),         # Kepler, and R470 has no open
    (["0x27b8"], "535.183.01", "open", "open", 0),
    ([], "550.54.14", "auto", "proprietary", 0),
    ([], "570.133.20", "auto", "open", 0),
    (["0x102d", "0x2901"], "570.133.20", "auto", "proprietary", 1),
])
def test_module_type_choice(tmp_path, devices, version, requested, expected, n_problems):
    choice = gpus.choose_module_type(scan_of(tmp_path, *devices), version, requested)
    assert choice.module_type == expected
    assert len(choice.problems) == n_problems, choice.problems


class _Ctx(SimpleNamespace):
    @property
    def pci_gpus(self) -> tuple[gpus.PciGpu, ...]:  # as Context's, scanned when read
        return tuple(gpus.scan(self.kernel.sys_dir))


def _ctx(sys_dir: Path, **settings) -> SimpleNamespace:
    return _Ctx(kernel=KernelState(sys_dir, sys_dir, sys_dir), settings=Settings(**settings))


def test_step_refuses_k80_with_a_too_new_driver(tmp_path):
    add_pci(tmp_path, "0000:00:04.0", "0x102d")
    step = check_gpus("550.54.14")
    with pytest.raises(UsageError) as err:
        step.run(_ctx(tmp_path))
    assert err.value.exit_code == ExitCode.USAGE
    assert "Tesla K80" in err.value.message and "R470 or older" in err.value.message
    assert "470.256.02" in err.value.hint  # a concrete version that works
    assert err.value.context["gpus"] == [
        "Tesla K80 at 0000:00:04.0 (Kepler, R470 or older)"]


def test_step_refuses_open_modules_on_kepler(tmp_path):
    add_pci(tmp_path, "0000:00:04.0", "0x102d")
    with pytest.raises(UsageError, match="cannot use the open kernel modules"):
        check_gpus("470.256.02", "open").run(_ctx(tmp_path))


def test_step_records_the_module_type(tmp_path):
    add_pci(tmp_path, "0000:00:04.0", "0x27b8")
    ctx = _ctx(tmp_path)
    assert check_gpus("550.54.14").run(ctx).module_type == "proprietary"


def test_step_without_gpus_does_not_fail(tmp_path):
    ctx = _ctx(tmp_path)
    checked = check_gpus("550.54.14").run(ctx)
    # no GPU: no device says which type it needs, so NVIDIA's default for the branch
    assert checked.module_type == "proprietary"


@pytest.mark.parametrize("device, name, too_old, ok", [
    # NVIDIA/open-gpu-kernel-modules README, Compatible GPUs (595.45.04)
    ("0x2bb5", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "570.133.20", "580.65.06"),
    ("0x3182", "NVIDIA B300 SXM6 AC", "575.57.08", "580.82.07"),
    ("0x31c2", "NVIDIA GB300", "570.133.20", "580.82.07"),
    ("0x2322", "NVIDIA H800 PCIe", "525.147.05", "535.230.02"),
    ("0x233a", "NVIDIA H800 NVL", "525.147.05", "535.230.02"),
])
def test_gke_gpus_are_known_with_their_first_branch(tmp_path, device, name, too_old, ok):
    found = scan_of(tmp_path, device)
    assert found[0].name == name
    assert gpus.branch_problems(found, too_old) and not gpus.branch_problems(found, ok)
    assert gpus.unknown(found) == []


def test_unknown_nvidia_gpu_is_warned_by_device_id(tmp_path):
    found = scan_of(tmp_path, "0x27b8", "0x3fff")
    assert gpus.unknown(found) == [
        "unknown NVIDIA GPU 10de:3fff at 0000:00:05.0: its supported driver branches are not "
        "known here, none are enforced"]
    with structlog.testing.capture_logs() as logs:
        check_gpus("550.54.14").run(_ctx(tmp_path))
    warned = [e for e in logs if e["event"] == "unknown_gpu"]
    assert len(warned) == 1 and "10de:3fff" in warned[0]["message"]
