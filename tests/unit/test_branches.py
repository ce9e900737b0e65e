"""branches.py: the dated branch policy (issue 23 item 5) and what it changes."""

from __future__ import annotations

import pytest

from installer import branches, gpus
from installer.distros.ubuntu import Ubuntu


def test_the_ubuntu_default_is_a_release_of_the_current_long_term_branch():
    known = branches.branch(Ubuntu.default_version)
    assert known is not None and known.kind == "long-term" and known.supported
    assert gpus.FALLBACK_VERSIONS[0] == Ubuntu.default_version


@pytest.mark.parametrize("version, ended", [
    ("535.183.01", "June 2026"), ("550.54.14", "ended"), ("570.133.20", "ended"),
    ("470.256.02", "2024"),
])
def test_ended_branches_warn_and_name_the_way_forward(version, ended):
    warning = branches.branch_warning(version)
    assert warning and f"past its end of life ({ended};" in warning
    assert branches.RECOMMENDED_VERSION in warning and branches.POLICY_DATE in warning


@pytest.mark.parametrize("version", ["580.82.07", "595.45.04", "560.35.03", "default"])
def test_supported_or_unlisted_branches_do_not_warn(version):
    assert branches.branch_warning(version) is None


def test_proprietary_modules_are_refused_from_r615(tmp_path):
    choice = gpus.choose_module_type([], "615.10.01", "proprietary")
    assert choice.problems == ["driver 615.10.01 (R615) has no proprietary kernel modules: "
                               "NVIDIA ships only the open ones from R615"]
    assert gpus.choose_module_type([], "595.45.04", "proprietary").problems == []
    assert gpus.choose_module_type([], "615.10.01", "auto").module_type == "open"
