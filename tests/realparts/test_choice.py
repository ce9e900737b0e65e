"""Which Debian versions the real-parts tier takes (provision.choose_branch), on package
lists shaped as PrivateApt.madison returns them: no archive needed."""

from __future__ import annotations

import pytest

from tests.debapt import ProvisionError
from tests.realparts.provision import BRANCHES, DRIVER_PACKAGES, choose

BW = "http://archive bookworm/non-free"
SEC = "http://security bookworm-security/non-free"
TRIXIE = "http://archive trixie/non-free"
BPO = "http://archive bookworm-backports/non-free"


def lists(**extra) -> dict[str, list[tuple[str, str]]]:
    """Debian 12 + security (the open tree lags), backports 535, trixie 550."""
    available: dict[str, list[tuple[str, str]]] = {}
    for pkg in DRIVER_PACKAGES.values():
        available[pkg] = [("550.163.01-2", TRIXIE), ("535.261.03-1", BW),
                          ("535.216.03-2~bpo12+1", BPO)]
        if pkg != "nvidia-open-kernel-source":
            available[pkg].insert(1, ("535.309.01-1~deb12u1", SEC))
    available["nvidia-modprobe"] = [("570.133.07-1", TRIXIE), ("535.161.07-1~deb12u1", BW)]
    for pkg in BRANCHES["legacy"].packages.values():
        available[pkg] = [("470.256.02-1~deb12u1", BW)]
    available.update(extra)
    return available


def test_each_branch_from_its_own_suites():
    pins = choose(lists())
    # 535.309.01 lacks the open tree in bookworm-security: the newest release all have.
    assert pins["main"]["nvidia-kernel-source"] == "535.261.03-1"
    assert pins["main"]["nvidia-open-kernel-source"] == "535.261.03-1"
    # Trixie's 550 never becomes "main", however new.
    assert pins["r550"]["nvidia-kernel-source"] == "550.163.01-2"
    assert pins["r550"]["firmware-nvidia-gsp"] == "550.163.01-2"
    assert pins["legacy"] == {p: "470.256.02-1~deb12u1"
                              for p in BRANCHES["legacy"].packages.values()}


def test_nvidia_modprobe_follows_its_own_release_train():
    pins = choose(lists())
    assert pins["main"]["nvidia-modprobe"] == "535.161.07-1~deb12u1"  # newest not newer
    assert pins["r550"]["nvidia-modprobe"] == "570.133.07-1"  # trixie has only a newer one


def test_a_branch_missing_a_required_package_is_refused():
    with pytest.raises(ProvisionError, match="550.x release has all of"):
        choose(lists(**{"libnvidia-ml1": [("535.261.03-1", BW)]}))
