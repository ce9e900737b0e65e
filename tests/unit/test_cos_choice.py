"""choice.choose: the COS decision as a pure function of what the flow probed."""

from __future__ import annotations

import pytest

from installer.distros.cos.choice import Probe, choose, precompiled_wanted
from installer.host.gpus import MODELS, PciGpu
from installer.kmod.signing import SigningPolicy
from installer.records import cache
from installer.records.cache import CacheKey, ModuleSource

V = "550.90.07"
L4, V100 = "0x27b8", "0x1db4"  # open modules supported / proprietary only
OPEN = SigningPolicy((), False, "none", False)
ENFORCED = SigningPolicy(("module.sig_enforce=1 is on the kernel command line",), False,
                         "none", True)
LOADPIN = SigningPolicy((), True, "none", False)


def _probe(device: str, policy: SigningPolicy, *, prebuilt: bool, precompiled: bool = False,
           requested: str = "auto") -> Probe:
    gpu = PciGpu("0000:00:04.0", device, "0x030200", None, MODELS[device])
    return Probe((gpu,), requested, policy, prebuilt, precompiled)


@pytest.mark.parametrize(("device", "policy", "prebuilt", "precompiled", "requested",
                          "source", "module_type", "blocked"), [
    # The build's signed open modules whenever the GPUs can use them.
    (L4, OPEN, True, False, "auto", "prebuilt", "open", False),
    (L4, ENFORCED, True, True, "auto", "prebuilt", "open", False),
    # ...unless refused: then a compile, refused (exit 10) where signatures are enforced.
    (L4, OPEN, True, False, "proprietary", "compiled", "proprietary", False),
    (L4, ENFORCED, True, False, "proprietary", "compiled", "proprietary", True),
    # Pre-Turing under enforcement: Google's precompiled proprietary driver.
    (V100, ENFORCED, True, True, "auto", "precompiled", "proprietary", False),
    (V100, ENFORCED, False, False, "auto", "compiled", "proprietary", True),
    # Where unsigned modules load, the precompiled driver is not used even if published.
    (V100, OPEN, False, True, "auto", "compiled", "proprietary", False),
    # LoadPin blocks every module from the install dir, signed or not.
    (L4, LOADPIN, True, False, "auto", "prebuilt", "open", True),
])
def test_choose(device, policy, prebuilt, precompiled, requested, source, module_type, blocked):
    chosen = choose(_probe(device, policy, prebuilt=prebuilt, precompiled=precompiled,
                           requested=requested), V)
    assert (chosen.source.value, chosen.module_type, chosen.blocked) == (source, module_type,
                                                                         blocked)
    assert chosen.signed is (source != "compiled")


def test_the_module_source_and_type_are_what_the_cache_records(tmp_path):
    """The record's CACHE_FLAVOR spelling, as every earlier version wrote it."""

    def recorded(probe: Probe) -> str:
        chosen = choose(probe, V)
        key = CacheKey(V, build_id="18244.151.14", source=chosen.source,
                       module_type=chosen.module_type)
        cache.write(tmp_path / ".cache", key, tmp_path, "test")
        text = (tmp_path / ".cache").read_text()
        assert (cache.CacheRecord.parse(text).source, cache.CacheRecord.parse(text).module_type
                ) == (chosen.source, chosen.module_type)
        return next(ln for ln in text.splitlines() if ln.startswith("CACHE_FLAVOR="))

    assert recorded(_probe(V100, ENFORCED, prebuilt=False, precompiled=True)) == \
        "CACHE_FLAVOR=precompiled-signed"
    assert recorded(_probe(V100, OPEN, prebuilt=False)) == "CACHE_FLAVOR=compiled-proprietary"
    assert recorded(_probe(L4, OPEN, prebuilt=True)) == "CACHE_FLAVOR=prebuilt-open"


def test_notes_say_why_prebuilt_modules_were_not_used():
    chosen = choose(_probe(V100, ENFORCED, prebuilt=True, precompiled=True), V)
    assert chosen.source is ModuleSource.PRECOMPILED and any("V100" in n for n in chosen.notes)


def test_the_precompiled_driver_is_probed_for_only_when_it_could_be_used():
    gpu = (PciGpu("0000:00:04.0", V100, "0x030200", None, MODELS[V100]),)
    assert precompiled_wanted(gpu, "auto", ENFORCED, use_prebuilt=False)
    assert not precompiled_wanted(gpu, "auto", ENFORCED, use_prebuilt=True)
    assert not precompiled_wanted(gpu, "auto", OPEN, use_prebuilt=False)
    assert not precompiled_wanted(gpu, "open", ENFORCED, use_prebuilt=False)
