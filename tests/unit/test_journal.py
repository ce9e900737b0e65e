"""Steps hand typed results to the executor, and note each node change in the journal
as they make it (records/results.py, records/journal.py); rollback.undo reads only the
journal. The kernel here is the fake one (tests/fixtures/kernel.py) driven through the
fake kmod tools, as in the integration tier; one rmmod that fails half way is a race
no check before it can rule out (a process opens /dev/nvidia-modeset after
ensure_replaceable found the driver unused)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from installer import rollback
from installer.base.errors import ModuleLoadError
from installer.host.installdir import Tree
from installer.host.runner import Runner
from installer.kmod.kernel import KernelState
from installer.plan import Plan, Step, StepTiming, execute
from installer.records.journal import (
    Journal,
    ModuleLoaded,
    ModuleUnloaded,
    ReadinessCleared,
)
from installer.records.results import Extracted, Results, Staged, StepResult
from installer.settings import Settings
from installer.steps import activate
from tests.fixtures.kernel import UBUNTU_KERNEL, FakeKernel, fake_ko

OLD, NEW = "535.183.01", "550.54.14"
# The old driver's modules and what each needs (NVIDIA's real ones also need drm and video).
OLD_MODULES = {"nvidia": (), "nvidia_modeset": ("nvidia",), "nvidia_uvm": ("nvidia",),
               "nvidia_drm": ("nvidia_modeset",)}


# ---------------------------------------------------------------- the executor


def test_the_executor_collects_results_in_plan_order_and_later_steps_read_them(tmp_path):
    seen = []

    def staged(ctx):
        return Staged(Tree(tmp_path / "staging"))

    def nothing(ctx):
        return None

    def extracted(ctx):
        seen.append(ctx.results.staging().root)  # an earlier step's result, by type
        return Extracted(tmp_path / "extract")

    plan = Plan("fresh", (Step("prepare_staging", staged), Step("clear_leftovers", nothing),
                          Step("extract_driver", extracted)))
    ctx = SimpleNamespace(results=Results())
    timings: list[StepTiming] = []
    execute(plan, ctx, timings)
    assert [(e.step, e.result) for e in ctx.results.entries] == [
        ("prepare_staging", Staged(Tree(tmp_path / "staging"))),
        ("extract_driver", Extracted(tmp_path / "extract"))]
    assert seen == [tmp_path / "staging"]
    assert [t.name for t in timings] == ["prepare_staging", "clear_leftovers", "extract_driver"]


def test_a_dry_run_collects_only_its_checks_results(tmp_path):
    class Checked(StepResult):
        pass

    plan = Plan("fresh", (Step("prepare_staging", lambda ctx: Staged(Tree(tmp_path))),
                          Step("check_gpu_compatibility", lambda ctx: Checked(), check=True)))
    ctx = SimpleNamespace(results=Results())
    execute(plan, ctx, [], checks_only=True)
    assert [e.step for e in ctx.results.entries] == ["check_gpu_compatibility"]


def test_a_plan_reading_a_result_before_any_step_gives_it_is_refused_when_made():
    """The order the results need is checked when the plan is made (every plan test and
    --dry-run make plans), not by an assertion in the step when it runs."""
    from installer.steps import staging

    url = "file:///srv/NVIDIA-Linux-x86_64-550.54.14.run"
    in_order = (staging.prepare_staging(), staging.download_driver(url, None),
                staging.extract_driver(NEW))
    assert [s.name for s in Plan("fresh", in_order).steps] == [
        "prepare_staging", "download_driver", "extract_driver"]
    with pytest.raises(ValueError, match="the fresh plan runs extract_driver before any step "
                       "that gives Fetched"):
        Plan("fresh", (in_order[0], in_order[2], in_order[1]))
    with pytest.raises(ValueError, match="runs download_driver before any step that gives Staged"):
        Plan("fresh", in_order[1:])


def test_a_step_asking_for_a_result_no_earlier_step_made_says_which():
    with pytest.raises(LookupError, match="no step before this one returned Staged"):
        Results().staging()


def test_results_are_frozen():
    result = Staged(Tree(Path("/x")))
    with pytest.raises(AttributeError):
        result.tree = Tree(Path("/y"))  # type: ignore[misc]


# ---------------------------------------------------------------- half-done steps


def _kernel(tmp_path, monkeypatch) -> tuple[FakeKernel, KernelState, Runner]:
    fake = FakeKernel(tmp_path / "kernel", UBUNTU_KERNEL)
    fake.add_gpu()  # an L4: nvidia.ko finds a GPU to drive
    monkeypatch.setenv("PATH", fake.subprocess_env()["PATH"])
    return (fake, KernelState(fake.proc_dir, fake.sys_dir, fake.dev_dir),
            Runner(env=fake.env()))


def _ctx(kernel: KernelState, runner: Runner, **more) -> SimpleNamespace:
    return SimpleNamespace(kernel=kernel, runner=runner, journal=Journal(), results=Results(),
                           settings=Settings(), modprobe_root=None, **more)


def test_a_load_that_fails_half_way_is_journaled_and_undone_exactly(tmp_path, monkeypatch):
    """nvidia.ko goes in, nvidia-uvm.ko is refused: the journal holds nvidia alone, and the
    rollback takes out exactly that (nothing else is in its journal to undo)."""
    fake, kernel, runner = _kernel(tmp_path, monkeypatch)
    staging = Tree(tmp_path / "staging")
    staging.drivers.mkdir(parents=True)
    for name, deps in (("nvidia", ()), ("nvidia-uvm", ("nvidia",))):
        (staging.drivers / f"{name}.ko").write_bytes(
            fake_ko(name.replace("-", "_"), UBUNTU_KERNEL, version=NEW, depends=deps))
    fake.refuse("nvidia_uvm")
    ctx = _ctx(kernel, runner)
    ctx.results.add("prepare_staging", Staged(staging))
    with pytest.raises(ModuleLoadError) as failed:
        activate.load_modules(from_staging=True).run(ctx)
    assert ctx.journal.facts == (ModuleLoaded("nvidia"),)
    assert list(fake.loaded()) == ["nvidia"]
    rollback.undo(ctx, failed.value)
    assert fake.loaded() == {}
    assert [c["argv"] for c in fake.calls("rmmod")] == [["nvidia"]]


def test_an_unload_that_fails_half_way_loads_the_old_driver_back(tmp_path, monkeypatch):
    """rmmod nvidia_uvm and nvidia_drm work, then nvidia_modeset is in use (a process
    opened it after the check): the old driver is half out. The journal holds the two
    modules that went, so the rollback loads the old driver back (whole, from the install
    dir) and makes its device files, and only then may its readiness file come back.

    On main (WorkState) the unloaded version was set only once every rmmod had
    worked: this failure left it unset, the rollback reloaded nothing, and it put the
    readiness file back for a driver without nvidia_uvm (CUDA fails on every GPU)."""
    fake, kernel, _ = _kernel(tmp_path, monkeypatch)
    for name, deps in OLD_MODULES.items():
        fake.preload(fake_ko(name, UBUNTU_KERNEL, version=OLD, depends=deps))

    class Racing(Runner):
        def run(self, argv, *args, **kwargs):
            result = super().run(argv, *args, **kwargs)
            if argv[:2] == ["rmmod", "nvidia_drm"]:
                fake.hold("nvidia_modeset")  # opened between the check and its rmmod
            return result

    ctx = _ctx(kernel, Racing(env=fake.env()))
    ctx.journal.note(ReadinessCleared(f"NVIDIA_DRIVER_VERSION={OLD}\n"))
    with pytest.raises(ModuleLoadError, match="failed to unload kernel module nvidia_modeset"):
        activate.unload_other_driver(NEW).run(ctx)
    assert sorted(fake.loaded()) == ["nvidia", "nvidia_modeset"]
    assert ctx.journal.facts[1:] == (ModuleUnloaded("nvidia_uvm", OLD),
                                     ModuleUnloaded("nvidia_drm", OLD))
    undone = []
    monkeypatch.setattr(rollback, "_reload_previous",
                        lambda ctx, version: undone.append(("reload", version)) or True)
    monkeypatch.setattr(rollback, "_make_device_files",
                        lambda ctx: undone.append(("device_files",)))
    monkeypatch.setattr(rollback, "_restore_readiness",
                        lambda ctx, error: undone.append(("readiness",)) or True)
    rollback.undo(ctx, ModuleLoadError("x"))
    assert undone == [("reload", OLD), ("device_files",), ("readiness",)]


def test_a_failed_reload_keeps_the_readiness_file_away(tmp_path, monkeypatch):
    """The same half-done unload, and the old driver does not come back: the readiness
    file stays cleared (it would name a driver missing modules)."""
    ctx = SimpleNamespace(journal=Journal())
    ctx.journal.note(ReadinessCleared(f"NVIDIA_DRIVER_VERSION={OLD}\n"))
    ctx.journal.note(ModuleUnloaded("nvidia_uvm", OLD))
    undone = []
    def reload_fails(ctx, version):
        undone.append(("reload", version))
        return False

    monkeypatch.setattr(rollback, "_reload_previous", reload_fails)
    monkeypatch.setattr(rollback, "_restore_readiness",
                        lambda ctx, error: undone.append(("readiness",)) or True)
    monkeypatch.setattr(rollback, "_remove_new_device_files", lambda *a: None)
    rollback.undo(ctx, ModuleLoadError("x"))
    assert undone == [("reload", OLD)]


# ---------------------------------------------------------------- the journal's answers


def test_the_journal_answers_from_its_facts_in_order():
    from installer.records.journal import (
        DeviceFilesListed,
        FirmwarePathRead,
        InstallCommitted,
        InstallPromoted,
    )

    journal = Journal()
    assert (journal.loaded, journal.unloaded_version, journal.firmware_path_before,
            journal.device_files_before, journal.readiness_before, journal.promoted,
            journal.committed) == ([], None, None, None, None, False, False)
    journal.note(FirmwarePathRead(None))  # no such parameter yet: not a value to restore
    journal.note(FirmwarePathRead(""))  # unset: restored as unset
    journal.note(FirmwarePathRead("/ours"))  # the second gpu_firmware reads what the first wrote
    journal.note(DeviceFilesListed(frozenset({"nvidiactl"})))
    journal.note(DeviceFilesListed(frozenset({"nvidiactl", "nvidia0"})))
    journal.note(ModuleLoaded("nvidia"))
    journal.note(ModuleLoaded("nvidia_uvm"))
    journal.note(InstallPromoted())
    assert journal.firmware_path_before == ""
    assert journal.device_files_before == {"nvidiactl"}
    assert journal.loaded == ["nvidia", "nvidia_uvm"] and journal.promoted
    assert not journal.committed
    journal.note(InstallCommitted())
    assert journal.committed
    with pytest.raises(AttributeError):
        journal.facts.append(ModuleLoaded("x"))  # type: ignore[attr-defined]


def test_a_failed_run_removes_the_download_dir_fetch_artifacts_journaled(tmp_path):
    """What a run fills outside the staging dir (COS's tools-dir downloads) is a journal
    fact too: the failed run's clean-up removes it, and nothing beside it."""
    from installer.commands import install
    from installer.records.journal import ScratchDir
    from installer.steps.staging import Fetch, fetch_artifacts

    src = tmp_path / "bucket" / "toolchain.tar.xz"
    src.parent.mkdir()
    src.write_bytes(b"a toolchain")
    downloads, kept = tmp_path / "tools/.downloads", tmp_path / "tools/toolchain"
    kept.mkdir(parents=True)
    ctx = SimpleNamespace(journal=Journal(), results=Results(), http=None,
                          install=SimpleNamespace(discard_staging=lambda: None))
    got = fetch_artifacts((Fetch("toolchain", src.as_uri(), "toolchain.tar.xz",
                                 into=downloads),)).run(ctx)
    assert got.files["toolchain"].path == downloads / "toolchain.tar.xz"
    assert ctx.journal.facts == (ScratchDir(downloads),)
    install._discard(ctx, ModuleLoadError("a later step failed"))
    assert not downloads.exists() and kept.is_dir()
