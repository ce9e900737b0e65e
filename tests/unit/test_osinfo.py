import pytest

from installer.base.errors import UnsupportedHostError
from installer.distros import host_info_from_text
from installer.host.osinfo import parse_env_file
from tests.fixtures.kernel import UBUNTU_KERNEL
from tests.fixtures.node import COS_113, COS_113_LSB_RELEASE, UBUNTU_2204


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param('A="x y"\nB=\'q\'\n', {"A": "x y", "B": "q"}, id="quotes"),
        pytest.param("# c\n\nJUNK\nK=v\n", {"K": "v"}, id="comments-and-junk"),
        pytest.param('E="a \\"b\\""\n', {"E": 'a "b"'}, id="escapes"),
        pytest.param('BAD="unterminated\nOK=1\n', {"OK": "1"}, id="malformed-line-skipped"),
    ],
)
def test_parse_env_file(text, expected):
    assert parse_env_file(text) == expected


def test_ubuntu_detected_with_kernel():
    info = host_info_from_text(UBUNTU_2204, None, UBUNTU_KERNEL)
    assert (info.os_id, info.distro, info.version_id, info.kernel_release) == (
        "ubuntu", "ubuntu", "22.04", UBUNTU_KERNEL)
    assert info.build_id is None


def test_debian_has_its_own_flow():
    info = host_info_from_text('ID=debian\nVERSION_ID="12"\n', None, "6.1.0-18-amd64")
    assert info.distro == "debian" and info.os_id == "debian"


def test_cos_build_and_board():
    info = host_info_from_text(COS_113, COS_113_LSB_RELEASE, "6.1.58+")
    assert (info.distro, info.build_id, info.version_id, info.board) == (
        "cos", "17801.218.41", "113", "lakitu")


@pytest.mark.parametrize(
    ("os_release", "needle"),
    [
        pytest.param(None, "cannot read", id="missing"),
        pytest.param("NAME=foo\n", "no ID", id="no-id"),
        pytest.param('ID=fedora\nPRETTY_NAME="Fedora Linux 40"\n', "unsupported host OS 'fedora'",
                     id="unknown"),
        pytest.param(COS_113.replace("BUILD_ID=17801.218.41\n", ""), "no BUILD_ID", id="cos-no-build"),
        pytest.param(COS_113.replace("17801.218.41", "latest"), "malformed BUILD_ID", id="cos-bad-build"),
    ],
)
def test_refused_hosts_exit_3(os_release, needle):
    with pytest.raises(UnsupportedHostError) as err:
        host_info_from_text(os_release, None, "6.1.0", os_release_path="/r/etc/os-release")
    assert needle in err.value.message
    assert err.value.exit_code == 3
    assert err.value.context["path"] == "/r/etc/os-release"


def test_shell_words_match_shlex_and_stay_linear():
    """The host's files are parsed as shlex would, without its quadratic cost."""
    import random
    import shlex
    import time

    from installer.host.osinfo import shell_words

    rng = random.Random(7)
    for _ in range(20000):
        text = "".join(rng.choice("ab '\"\\\t$`#\r\n") for _ in range(rng.randint(0, 12)))
        try:
            want = shlex.split(text, comments=False, posix=True)
        except ValueError:
            want = None
        assert shell_words(text) == want, repr(text)
    start = time.monotonic()
    assert shell_words('"' + "x" * (8 << 20) + '"') == ["x" * (8 << 20)]
    assert shell_words('"' + "x" * (8 << 20)) is None  # an open quote: still one pass
    assert time.monotonic() - start < 5
