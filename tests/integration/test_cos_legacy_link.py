"""COS precompiled modules: the legacy-link retry of cos-gpu-installer v2.

v2 (src/cmd/cos_gpu_installer/internal/commands/install.go L391-400) links the
precompiled interfaces with the toolchain's ld.lld; when the kernel refuses the
result it links them again the legacy way (installer.go L260-298: nvidia-installer's
`ld -d -r` with the container's GNU ld, whose output Google's signatures match bit
for bit) and loads once more. Here the toolchain's ld.lld writes a module the kernel
refuses (not what was signed) and a stand-in GNU `ld` first on the pod's PATH links
as the fixture linker does.
"""

# ruff: noqa: F811  (test_cos_install's fixtures, imported, are used as arguments)
from __future__ import annotations

import pytest

from tests.cosbucket import DEFAULT_V, FAKE_LD, SIGNED_MODULES
from tests.integration.test_cos_install import (  # noqa: F401  (pytest fixtures)
    bucket,
    cos_custom_run,
    cos_runs,
    node,
    pod,
    server,
)
from tests.pod import events, last_event

pytestmark = pytest.mark.chroot

MISLINKING_LLD = """#!/bin/sh
# An ld.lld whose output the kernel refuses: not the bytes Google signed.
echo "$(basename "$0") $*" >> "${FAKE_CC_LOG:-/dev/null}"
out=
while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
[ -z "$out" ] || echo "mislinked by ld.lld" > "$out"
"""


@pytest.fixture
def enforcing_v100(kernel, bucket, cos_custom_run):
    """A V100 on a node enforcing signatures: the precompiled flavour, linked by a bad lld."""
    kernel.add_gpu(device="0x1db4")
    kernel.set_sig_enforce(True)
    bucket.custom_runs = {DEFAULT_V: cos_custom_run}
    bucket.signature_versions = (DEFAULT_V,)
    bucket.lld = MISLINKING_LLD
    return kernel


def with_gnu_ld(kernel, script: str):
    """`ld` first on the pod's PATH (the fake kernel's bin dir goes to /usr/local/sbin)."""
    ld = kernel.bin_dir / "ld"
    ld.write_text(script)
    ld.chmod(0o755)


def events_named(proc, name: str) -> list[dict]:
    return [e for e in events(proc.stderr) if e.get("event") == name]


def link_log(kernel) -> list[str]:
    return (kernel.root / "cc.log").read_text().splitlines()


def test_a_refused_lld_link_is_relinked_with_gnu_ld_and_loads(node, pod, enforcing_v100):
    kernel = enforcing_v100
    with_gnu_ld(kernel, FAKE_LD)
    proc = pod.run("install", env={"FAKE_CC_LOG": str(kernel.root / "cc.log")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = last_event(proc)
    assert final["plan"] == "fresh" and final["driver_version"] == DEFAULT_V

    # The first load was refused, and the log says why and what happens next.
    (failed,) = events_named(proc, "precompiled_load_failed")
    # Google's signature does not cover the ld.lld output: the kernel refuses it.
    assert "Key was rejected" in failed["error"] and "legacy linking" in failed["retry"]
    assert len(events_named(proc, "precompiled_loaded_after_legacy_link")) == 1
    # Linked twice: ld.lld with the kernel's linker script, then GNU ld as nvidia-installer.
    lld = [ln for ln in link_log(kernel) if "ld.lld" in ln.split()[0]]
    gnu = [ln for ln in link_log(kernel) if ln.split()[0] == "ld"]
    assert len(lld) == 2 and all(" -T " in ln for ln in lld)
    assert [ln.split()[1:4] for ln in gnu] == [["-d", "-r", "-o"]] * 2
    assert gnu[0].split()[4].endswith("/kernel/nvidia.ko")
    assert gnu[1].split()[4].endswith("/kernel/nvidia-modeset.ko")
    insmods = [c["argv"][0].rsplit("/", 1)[-1] for c in kernel.calls("insmod")]
    assert insmods.count("nvidia.ko") == 2

    # What is installed and loaded is the relinked, signed module.
    for ko in SIGNED_MODULES:
        data = (node.install_dir / "drivers" / ko).read_bytes()
        assert data.endswith(b"~Module signature appended~\n") and b"mislinked" not in data
    assert kernel.loaded()["nvidia"].version == DEFAULT_V
    assert "CACHE_FLAVOR=precompiled-signed" in (node.install_dir / ".cache").read_text()


def test_both_links_refused_is_exit_8_naming_both(node, pod, enforcing_v100):
    kernel = enforcing_v100
    with_gnu_ld(kernel, MISLINKING_LLD)
    proc = pod.run("install")
    assert proc.returncode == 8, proc.stderr[-3000:]
    final = last_event(proc)
    assert final["event"] == "install_failed" and final["error_class"] == "module_load"
    message = final["error"]
    assert "neither linked with ld.lld" in message and "nor relinked with GNU ld" in message
    assert message.count("Key was rejected") == 2, message
    assert final["step"] == "load_modules"
    # Nothing left loaded, nothing recorded.
    assert "nvidia" not in kernel.loaded()
    assert not (node.install_dir / ".cache").exists()
