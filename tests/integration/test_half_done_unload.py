"""An rmmod that fails half way through unloading the old driver (records/journal.py).

ensure_replaceable finds the old driver unused, then something opens /dev/nvidia0
before its last rmmod (a workload starting, a monitoring agent): nvidia_uvm is out,
nvidia stays. The journal holds each module as it went, so the rollback loads the old
driver back whole, with its device files, and only then puts driver-ready back.

On main (WorkState) the unloaded version was noted only after every rmmod worked: this
run ended with nvidia_uvm missing (CUDA fails on every GPU) and driver-ready restored
for that broken driver."""

from __future__ import annotations

import pytest

from tests.integration.test_rollback import Failure, assert_restored, upgrade_fails

pytestmark = pytest.mark.chroot

# rmmod that refuses `rmmod nvidia` once, as kmod's does for a module whose refcount is
# not 0 (kmod rmmod.c: "Module %s is in use"), then is the fake kmod again.
RMMOD_BUSY_ONCE = """#!/bin/sh
if [ "$*" = "nvidia" ] && [ -e {arm} ]; then
    rm -f {arm}
    echo "rmmod: ERROR: Module nvidia is in use" >&2
    exit 1
fi
exec "$(dirname "$0")/real/rmmod" "$@"
"""


def nvidia_busy_at_its_rmmod(node, kernel):
    arm = kernel.root / "rmmod-busy"
    (kernel.bin_dir / "real").mkdir()
    (kernel.bin_dir / "real/rmmod").symlink_to("../fakekmod")  # the fake kmod, by its name
    (kernel.bin_dir / "rmmod").unlink()
    (kernel.bin_dir / "rmmod").write_text(RMMOD_BUSY_ONCE.format(arm=arm))
    (kernel.bin_dir / "rmmod").chmod(0o755)
    arm.touch()


def test_an_unload_that_fails_half_way_loads_the_old_driver_back(node, kernel, tmp_path):
    before, proc = upgrade_fails(node, kernel, tmp_path, None, "unload_other_driver", 8,
                                 Failure(after=nvidia_busy_at_its_rmmod))
    assert "failed to unload kernel module nvidia" in proc.stderr
    assert_restored(before, node, kernel, proc)
