"""What a cache hit imports: a node's every boot runs it, so it must not load what it does
not use (docs/performance.md; the time is measured by bench/cache_hit.py, here only which
modules load). Read in the installer's own process at its exit (tests/fixtures/importwatch.py),
run in the pod as the DaemonSet runs it. ``--help``: tests/unit/test_cli.py."""

from __future__ import annotations

import pytest

from tests.pod import last_event, ok

pytestmark = pytest.mark.chroot

# The network stack, its retries, the archive codec, the jail's seccomp binding, templates:
# none is used by a run that loads the modules already installed. (rich is not listed:
# structlog imports it where it is installed, as in the dev venv the pod runs here; the
# image has none.)
HEAVY = ("requests", "urllib3", "tenacity", "certifi", "idna", "charset_normalizer",
         "zstandard", "pyseccomp", "jinja2")
# The installer's own modules an Ubuntu cache hit does not use: another distro's flow, the
# jail (all but harvest and visible, stdlib-only readers of what a jail wrote, which the
# failure diagnostics use), the bundle, the .run and build modules, downloads, the fabric
# manager, hashlib; and asyncio, which structlog imports and installer.base.lazyimport
# defers (its submodules load with it).
JAIL = tuple(f"installer.jail.{m}" for m in (
    "run_in_jail", "seccomp", "limits", "cgroups", "cgroup_memory", "cpus", "archive",
    "tarstream"))
NOT_ON_A_CACHE_HIT = ("installer.distros.cos.flow", *JAIL, "installer.bundle",
                      "installer.driver.nvidia_run", "installer.driver.module_build",
                      "installer.net.transfer", "installer.net.parallel", "installer.net.fetch",
                      "installer.services.fabricmanager", "asyncio.base_events",
                      "hashlib",  # OpenSSL's libcrypto: a cache hit checks files by stat
                      # shutil (with bz2, lzma and zlib), tempfile and ctypes: neither click
                      # nor structlog imports them, and a cache hit uses none (~10 ms)
                      "shutil", "tempfile", "ctypes")


def _under(names: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes))


def _imported(pod, tmp_path, name: str) -> tuple[dict, set[str]]:
    """``install`` in the pod through the import watch: its last event, and the names of
    every module it imported."""
    watch = tmp_path / f"watch-{name}"
    watch.mkdir()
    pod.shared.append(watch)  # the pod writes there at the same path
    listing = watch / "modules.txt"
    proc = ok(pod.run("install", module="tests.fixtures.importwatch",
                      env={"NDI_IMPORTED_MODULES_FILE": str(listing)}))
    names = set(listing.read_text().split())
    assert {"click", "structlog", "installer.commands.install"} <= names  # the run's own list
    return last_event(proc), names


def _top(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


def test_a_cache_hit_imports_no_network_archive_seccomp_or_template_library(pod, kernel, tmp_path):
    # The control: the fresh install downloads the .run, so the watch sees the network stack.
    first, fresh = _imported(pod, tmp_path, "fresh")
    assert first["plan"] == "fresh"
    assert {"requests", "tenacity"} <= _top(fresh)
    kernel.unload_all()  # a reboot
    event, cached = _imported(pod, tmp_path, "cached")
    assert event["plan"] == "cached"
    assert sorted(_top(cached) & set(HEAVY)) == []


def test_a_cache_hit_loads_only_its_own_flow_and_steps(pod, kernel, tmp_path):
    # The control: the fresh install downloads, extracts and builds in the jail.
    first, fresh = _imported(pod, tmp_path, "fresh")
    assert first["plan"] == "fresh"
    assert {"installer.net.transfer", "installer.driver.nvidia_run",
            "installer.jail.run_in_jail"} <= fresh
    kernel.unload_all()  # a reboot
    event, cached = _imported(pod, tmp_path, "cached")
    assert event["plan"] == "cached"
    assert "installer.distros.headers_build_flow" in cached  # the Ubuntu node's own flow
    assert _under(cached, NOT_ON_A_CACHE_HIT) == []
