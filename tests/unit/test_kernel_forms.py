"""The kernel state a real GPU node shows (issue 30 §1.1, §1.2): /proc/modules without
CONFIG_MODULE_UNLOAD, kernel.modules_disabled=1, loaded state from /sys/module.

The lines are copied from a real H100 node (tests/data/gpu-node, the transcript's
section B); the forms are those torvalds/linux kernel/module/procfs.c ``m_show`` and
``print_unload_info`` print.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from installer.base.errors import ExitCode, ModuleLoadError
from installer.kmod import modules
from installer.kmod.kernel import KernelState, parse_proc_modules
from installer.steps import checks

# grep -E "^nvidia|^drm" /proc/modules on the H100 node: refcount and users are "-".
REAL_NODE_MODULES = """nvidia_uvm 1830912 - - Live 0xffffffffc080c000 (O)
nvidia 14299136 - - Live 0xffffffffc0400000 (O)
"""


def _node(tmp_path: Path, proc_modules: str, *, version: str | None = "580.159.04",
          modules_disabled: str = "0") -> KernelState:
    """A kernel state dir as the H100 node's: /sys/module/<m>/{initstate,version}."""
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "modules").write_text(proc_modules)
    (proc / "sys/kernel/modules_disabled").write_text(modules_disabled + "\n")
    for line in proc_modules.splitlines():
        d = sys / "module" / line.split()[0]
        d.mkdir(parents=True)
        (d / "initstate").write_text("live\n")
        if version and line.startswith("nvidia "):
            (d / "version").write_text(version + "\n")
    return KernelState(proc_dir=proc, sys_dir=sys, dev_dir=tmp_path / "dev")


def test_modules_without_unload_support_are_parsed_not_dropped():
    """Caught: the parser took int('-') as a malformed line and dropped both, so a
    working driver read as none loaded."""
    mods = parse_proc_modules(REAL_NODE_MODULES)
    assert sorted(mods) == ["nvidia", "nvidia_uvm"]
    assert mods["nvidia"].refcnt is None and mods["nvidia"].used_by == ()
    assert mods["nvidia"].size == 14299136 and mods["nvidia"].state == "Live"


@pytest.mark.parametrize("line, refcnt, users, permanent", [
    ("nvidia 56823808 3 nvidia_uvm,nvidia_modeset, Live 0x0 (POE)", 3,
     ("nvidia_uvm", "nvidia_modeset"), False),
    ("nvidia_uvm 1380352 0 - Live 0x0 (POE)", 0, (), False),
    ("crc32c_intel 24576 0 [permanent], Live 0x0", 0, (), True),
    ("x 16384 1 y,[permanent], Live 0x0", 1, ("y",), True),
    ("nvidia_uvm 1830912 - - Live 0xffffffffc080c000 (O)", None, (), False),
])
def test_every_form_print_unload_info_prints(line, refcnt, users, permanent):
    (mod,) = parse_proc_modules(line).values()
    assert (mod.refcnt, mod.used_by, mod.permanent) == (refcnt, users, permanent)


def test_the_loaded_driver_is_read_from_sysfs(tmp_path):
    kernel = _node(tmp_path, REAL_NODE_MODULES)
    assert kernel.is_loaded("nvidia") and kernel.is_loaded("nvidia_uvm")
    assert not kernel.is_loaded("nvidia_modeset")
    assert modules.loaded_driver_version(kernel) == "580.159.04"
    assert not kernel.can_unload()


def test_a_kernel_with_refcounts_can_unload(tmp_path):
    kernel = _node(tmp_path, "nvidia 56823808 0 - Live 0x0 (POE)\n")
    assert kernel.can_unload() and modules.why_no_unload(kernel) is None


def _open_device(proc: Path, pid: int, comm: str, target: str) -> None:
    fd_dir = proc / str(pid) / "fd"
    fd_dir.mkdir(parents=True)
    (proc / str(pid) / "comm").write_text(comm + "\n")
    os.symlink(target, fd_dir / "3")


def test_without_a_refcount_the_processes_holding_device_files_are_the_users(tmp_path):
    """Caught: refcnt - len(used_by) on a kernel without refcounts; and with the lines
    dropped nothing was ever in use, so uninstall skipped its in-use refusal."""
    kernel = _node(tmp_path, REAL_NODE_MODULES)
    assert modules.users(kernel) == {}
    _open_device(kernel.proc_dir, 4242, "python3", "/dev/nvidia0")
    _open_device(kernel.proc_dir, 4243, "bash", "/dev/null")
    assert modules.users(kernel) == {"nvidia": ["pid 4242 (python3) has /dev/nvidia0 open"]}
    held = modules.holders(kernel)
    assert held == "nvidia: pid 4242 (python3) has /dev/nvidia0 open"  # named once


def test_a_kernel_that_cannot_unload_refuses_to_replace_or_unload_and_says_why(tmp_path):
    kernel = _node(tmp_path, REAL_NODE_MODULES)
    in_use = modules.in_use_by_other(kernel, "580.82.07")
    assert in_use is not None and in_use.running_version == "580.159.04"
    assert "CONFIG_MODULE_UNLOAD" in in_use.holders
    assert modules.in_use_by_other(kernel, "580.159.04") is None  # the one wanted
    with pytest.raises(ModuleLoadError) as exc:
        modules.ensure_replaceable(kernel, "580.82.07")
    assert exc.value.exit_code == ExitCode.MODULE_LOAD
    assert "cannot unload modules" in exc.value.message and "reboot" in exc.value.hint

    class NoRunner:
        def run(self, argv, **kw):
            raise AssertionError(f"ran {argv}: rmmod is ENOSYS on this kernel")

    with pytest.raises(ModuleLoadError, match="CONFIG_MODULE_UNLOAD"):
        modules.unload(kernel, NoRunner())


def test_modules_disabled_blocks_loads_and_unloads(tmp_path):
    kernel = _node(tmp_path, "nvidia 56823808 0 - Live 0x0 (POE)\n", modules_disabled="1")
    assert kernel.modules_disabled()
    assert "kernel.modules_disabled=1" in modules.why_no_load(kernel)
    assert "kernel.modules_disabled=1" in modules.why_no_unload(kernel)


class _Ctx:
    def __init__(self, kernel):
        self.kernel = kernel


def test_the_module_loading_check_refuses_only_a_run_that_must_load(tmp_path):
    """kernel.modules_disabled=1 (the H100 node): a run that must load refuses naming it;
    one whose driver is loaded already has nothing to load and goes on."""
    nothing = _node(tmp_path / "a", "", modules_disabled="1")
    with pytest.raises(ModuleLoadError) as exc:
        checks.check_module_loading("580.159.04").run(_Ctx(nothing))
    assert exc.value.exit_code == ExitCode.MODULE_LOAD
    assert "kernel.modules_disabled=1" in exc.value.message
    loaded = _node(tmp_path / "b", REAL_NODE_MODULES, modules_disabled="1")
    checks.check_module_loading("580.159.04").run(_Ctx(loaded))  # nothing to load
    with pytest.raises(ModuleLoadError, match="modules_disabled"):
        checks.check_module_loading("580.82.07").run(_Ctx(loaded))  # another version
    enabled = _node(tmp_path / "c", "")
    checks.check_module_loading("580.159.04").run(_Ctx(enabled))
