import subprocess
import sys

import pytest

from installer.base.errors import UnsupportedHostError
from installer.commands.manifests import values
from installer.distros import DISTROS, Cos, Ubuntu, by_name, flows, recognise
from installer.host.osinfo import parse_env_file

COS = 'ID=cos\nVERSION_ID=113\nBUILD_ID=17801.218.41\nPRETTY_NAME="COS 113"\n'


def _recognise(text, lsb=None):
    return recognise(parse_env_file(text), lsb, "6.1.0", "/r/etc/os-release")


@pytest.mark.parametrize(("os_release", "distro", "os_id"), [
    (COS, "cos", "cos"),
    ("ID=ubuntu\nVERSION_ID=22.04\n", "ubuntu", "ubuntu"),
    ("ID=debian\n", "debian", "debian"),
    # a derivative names its parent in ID_LIKE (os-release(5))
    ("ID=pop\nID_LIKE=\"ubuntu debian\"\n", "ubuntu", "pop"),
    ("ID=Ubuntu\n", "ubuntu", "ubuntu"),
])
def test_each_distro_recognises_its_hosts(os_release, distro, os_id):
    info = _recognise(os_release)
    assert (info.distro, info.os_id) == (distro, os_id)
    assert flows.for_host(info).distro is by_name(distro)


def test_cos_needs_its_build_and_reads_the_board():
    info = _recognise(COS, "CHROMEOS_RELEASE_BOARD=lakitu\n")
    assert (info.build_id, info.board, info.version_id) == ("17801.218.41", "lakitu", "113")
    with pytest.raises(UnsupportedHostError, match="malformed BUILD_ID"):
        _recognise(COS.replace("17801.218.41", "17801"))
    # ID_LIKE=cos names no build: not a COS host
    with pytest.raises(UnsupportedHostError, match="unsupported host OS 'cosish'"):
        _recognise("ID=cosish\nID_LIKE=cos\n")


def test_unsupported_host_names_every_distro():
    with pytest.raises(UnsupportedHostError) as err:
        _recognise('ID=fedora\nPRETTY_NAME="Fedora Linux 40"\n')
    assert err.value.hint == ("supported: Container-Optimized OS (ID=cos), "
                              "Ubuntu (ID=ubuntu), Debian (ID=debian)")


def test_manifest_flavours_come_from_the_distro_classes():
    assert values.FLAVORS == tuple(d.name for d in DISTROS) == ("cos", "ubuntu", "debian")
    assert values.FLAVOR_TITLES["cos"] == Cos.title
    assert {"cos": "default", "ubuntu": Ubuntu.default_version,
            "debian": Ubuntu.default_version} == values.DEFAULT_DRIVER_VERSION
    assert values.GKE_OS_DISTRIBUTIONS["ubuntu"] == ("ubuntu", "ubuntu_containerd")


def test_recognising_hosts_does_not_import_the_cos_flow():
    # The COS plans pull in the artifacts client and code an Ubuntu run never uses; only
    # the flows (install, bundle build) import them.
    code = ("import sys, installer.distros; print('installer.distros.cos.flow' in sys.modules, "
            "'installer.distros.cos.artifacts' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]


def test_distro_options_live_with_their_distro_and_name_their_pin_option():
    """Issue 32 item 4: Settings has no COS field; COS declares its own options, and the
    unpinned-artifacts warning names the option that pins them."""
    from dataclasses import fields

    from installer.commands.node_cli import install
    from installer.settings import Settings

    assert not [f.name for f in fields(Settings)
                if "cos" in f.name or "toolchain" in f.name or f.name == "preload"]
    with_options = {d.name: d.options for d in DISTROS if d.options}
    assert set(with_options) == {"cos"}  # Ubuntu downloads nothing but the .run
    install_options = {o for p in install.params for o in p.opts}
    unpinned = with_options["cos"]().unpinned()
    assert unpinned is not None and "--cos-artifacts-sha256" in unpinned
    assert "--cos-artifacts-sha256" in install_options
    assert with_options["cos"](artifacts_sha256="/pins").unpinned() is None


def test_the_readme_recipe_names_files_that_exist():
    """docs/development/add-a-distro.md (the README's "Add a distro" until issue 41): every
    file it names (but the new one's) is where it says."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    text = (repo / "docs/development/add-a-distro.md").read_text()
    section = text.split("## Add a distro", 1)[1].split("\n## ", 1)[0]
    named = {m for m in re.findall(r"`((?:installer|tests)/[\w/.]+\.py)`", section)}
    named |= {f"installer/{m}" for m in re.findall(r"`(distros/[\w/.]+\.py)`", section)}
    assert "installer/distros/headers_build.py" in named and len(named) >= 5
    assert all((repo / path).is_file() for path in named), named
    for distro in DISTROS:  # and the recipe's attribute names are the classes' own
        for attr in ("name", "title", "os_ids", "gke_os_distributions", "image_suffix",
                     "daemonset", "version_alias"):
            assert hasattr(distro, attr) and f"`{attr}`" in section
