"""A bundle of NVIDIA's real modules, installed on a fresh node in the real kernel (issue 15).

``bundle build``'s writer packed the real 535 install built on the host
(tests/vm/bundles.py), ``bundle index`` indexed it; the guest runs
``install --prebuilt-url file://... --prebuilt-only``: no compiler, no .run. The
kernel accepts the bundle's nvidia.ko and its init finds no GPU (exit 8, as
test_real_modules.py explains), so nothing is promoted. A missing bundle is exit 5; a tampered one and
one for another kernel release are exit 6, and nothing reaches the kernel.
"""

from __future__ import annotations

import pytest

from tests.vm.harness import BootResult
from tests.vm.test_real_modules import (
    NV_MODULES,
    assert_bundle_installed_without_compiling,
    final_event,
    ok,
)

pytestmark = [pytest.mark.vm, pytest.mark.timeout(3600)]


def test_bundle_modules_loaded_by_the_real_kernel(boot_bundle: BootResult):
    ok(boot_bundle.step("list-bundles"))
    ok(boot_bundle.step("fresh-node"))
    assert_bundle_installed_without_compiling(boot_bundle.step("bundle-install"))
    # nvidia.ko's in-tree dependency came from the guest's own tree; nothing half-loaded,
    # and without a GPU nothing was promoted from the staging dir.
    after = boot_bundle.step("after-bundle-install")
    assert "drm" in set(after.loaded()) and not set(after.loaded()) & set(NV_MODULES), after.describe()
    assert "No such file" in after.output, after.describe()


@pytest.mark.parametrize(("name", "exit_code", "says"), [
    ("bundle-missing", 5, ("no prebuilt bundle",)),
    # Extracted while it downloads: zstd's own checks refuse the changed bytes before the
    # end of the body, where its sha256 is compared. Either is exit 6, nothing loaded.
    ("bundle-tampered", 6, ("sha256 mismatch", "corrupt archive")),
    ("bundle-other-kernel", 6, ("holds",)),
])
def test_bad_bundles_end_in_their_exit_code_before_any_load(boot_bundle: BootResult, name,
                                                             exit_code, says):
    step = boot_bundle.step(name)
    assert step.rc == exit_code, step.describe()
    final = final_event(step)
    assert final["exit_code"] == exit_code, step.describe()
    assert any(text in final["error"] for text in says), step.describe()
    # The kernel was never asked: no nvidia module, no NVRM line, nothing installed.
    assert not any("NVRM" in ln or "nvidia" in ln for ln in step.dmesg), step.describe()
    after = boot_bundle.step(f"after-{name}")
    assert "No such file" in after.output and not set(after.loaded()) & set(NV_MODULES), \
        after.describe()
