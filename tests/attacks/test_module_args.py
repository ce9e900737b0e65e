"""Issue 33 item 7: module arguments are operator input, checked when the command starts.

A newline inside one (``--module-arg`` or ``NVIDIA_MODULE_ARGS`` from a templated env)
ended in a traceback after the install was promoted (the readiness file refused the value
spanning lines), and every rerun failed the same way. insmod takes each argument as one
``param=value`` word; a value with whitespace cannot round-trip through anything that
lists the arguments (the readiness file's NVIDIA_MODULE_ARGS, the env var itself).
"""

from __future__ import annotations

import pytest

from tests.attacks.conftest import outcome

pytestmark = pytest.mark.chroot


@pytest.mark.parametrize("arg, words", [
    ("nvidia.NVreg_EnableGpuFirmware=0\nnvidia.NVreg_X=1", ["--module-arg", "whitespace"]),
    ("nvidia.NVreg_RegistryDwords=A=1;\tB=2", ["--module-arg", "whitespace"]),
    ("nvidia.NVreg-X=1", ["--module-arg", "parameter name"]),
    ("nvi/dia.NVreg_X=1", ["--module-arg", "module name"]),
])
def test_a_bad_module_arg_is_exit_2_before_anything_changes(ubuntu, arg, words):
    proc = ubuntu.run("install", "--module-arg", arg)
    last = outcome(proc, 2, *words)
    assert "Traceback" not in proc.stderr and last["error_class"] == "usage"
    assert not (ubuntu.node.install_dir / "drivers").exists()
    ubuntu.assert_host_unchanged()


def test_a_newline_after_a_good_install_leaves_it_and_the_next_run_works(ubuntu):
    outcome(ubuntu.run("install"), 0)
    ready = ubuntu.node.path("/run/nvidia/validations/driver-ready").read_text()
    ubuntu.snapshot()
    proc = ubuntu.run("install", "--force",
                      "--module-arg", "nvidia.NVreg_EnableGpuFirmware=0\nnvidia.NVreg_X=1")
    outcome(proc, 2, "--module-arg")
    ubuntu.assert_host_unchanged()
    assert ubuntu.node.path("/run/nvidia/validations/driver-ready").read_text() == ready
    assert outcome(ubuntu.run("install"), 0)["plan"] == "cached"
