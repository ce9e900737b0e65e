"""branches.py: the dated branch policy (issue 23 item 5) and what it changes."""

from __future__ import annotations

import pytest

from installer.base import branches
from installer.distros.ubuntu import Ubuntu
from installer.host import gpus


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


def _offered(text: str) -> list[str]:
    """The versions and branches a message offers as an example."""
    import re
    return re.findall(r"\b(?:R\d{3}|\d{3}\.\d+(?:\.\d+)?)\b", text)


def _example_messages() -> list[str]:
    from installer.base.errors import UsageError
    from installer.commands.bundle_cli import pick_target
    from installer.distros.cos.artifacts import parse_requested
    from installer.distros.cos.host import Cos
    from installer.driver.nvidia_options import check_version
    from installer.records.bundle_manifest import BundleError, BundleKey

    said = []
    for call in (lambda: check_version("5x0"), lambda: parse_requested("newest"),
                 lambda: pick_target("bad", 0),
                 lambda: BundleKey("5x0", "6.8.0-1015-gke", "open")):
        with pytest.raises((UsageError, BundleError)) as info:
            call()
        said.append(f"{info.value} {getattr(info.value, 'hint', '')}")
    for distro in (Ubuntu, Cos):
        with pytest.raises(ValueError) as info:
            distro.check_version_request("newest")
        said.append(str(info.value))
    return said


def test_examples_in_messages_are_from_supported_branches():
    """Issue 41 §4: errors said "use a version such as 550.127.05", a branch this table
    calls ended. Every version or branch a message offers comes from the table."""
    said = _example_messages()
    offered = [v for text in said for v in _offered(text)]
    assert len(offered) >= len(said), said  # each message offers one
    for version in offered:
        known = branches.branch(version.lstrip("R") + ("" if "." in version else ".0.0"))
        assert known is not None, (version, said)
        # An ended branch only where it is named for what only it serves (R470: Kepler).
        assert known.supported or any(f"{version} for Kepler" in text for text in said), (
            version, said)
