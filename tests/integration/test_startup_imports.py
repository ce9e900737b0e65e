"""What a cache hit imports (issue 40 item 6): a node's every boot runs it, so it must not
load what it does not use. Measured in bench/cache_hit.py; here only which modules load."""

from __future__ import annotations

import pytest

from tests.pod import last_event, ok

pytestmark = pytest.mark.chroot

# The network stack, the archive codec, the jail's seccomp binding, templates: none is used
# by a run that loads the modules already installed. (rich is not listed: structlog imports
# it where it is installed, as in the dev venv the pod runs here; the image has none.)
HEAVY = ("requests", "urllib3", "tenacity", "certifi", "idna", "charset_normalizer",
         "zstandard", "pyseccomp", "jinja2")
# Still imported today: the plan's step modules import the network and archive modules at
# their top (requests, tenacity through installer.context and installer.net; zstandard
# through installer.jail.tarstream; pyseccomp through installer.jail.run_in_jail). The test holds the
# list: a new heavy import fails it, and it passes once the list is empty.
KNOWN_GAP = ("certifi", "charset_normalizer", "idna", "pyseccomp", "requests", "tenacity",
             "urllib3", "zstandard")


def test_a_cache_hit_imports_no_network_archive_or_template_library(pod, kernel, tmp_path):
    ok(pod.run("install"))
    kernel.unload_all()  # a reboot
    watch = tmp_path / "watch"
    watch.mkdir()
    pod.shared.append(watch)  # the pod writes there at the same path
    listing = watch / "modules.txt"
    proc = ok(pod.run("install", module="tests.fixtures.importwatch",
                      env={"NDI_IMPORTED_MODULES_FILE": str(listing)}))
    assert last_event(proc)["plan"] == "cached"
    names = set(listing.read_text().split())
    assert {"click", "structlog", "installer.commands.install"} <= names  # the listing is the run's
    heavy = sorted({name.split(".")[0] for name in names} & set(HEAVY))
    if heavy and heavy == sorted(KNOWN_GAP):
        pytest.xfail(f"a cache hit still imports {', '.join(heavy)} (issue 40 item 6)")
    assert heavy == []
