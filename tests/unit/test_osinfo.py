import pytest

from installer.errors import UnsupportedHostError
from installer.osinfo import host_info_from_text, parse_env_file
from tests.fixtures.kernel import UBUNTU_KERNEL

UBUNTU = '''PRETTY_NAME="Ubuntu 22.04.4 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
VERSION="22.04.4 LTS (Jammy Jellyfish)"
ID=ubuntu
ID_LIKE=debian
'''
COS = '''NAME="Container-Optimized OS"
ID=cos
PRETTY_NAME="Container-Optimized OS from Google"
HOME_URL="https://cloud.google.com/container-optimized-os/docs"
BUG_REPORT_URL="https://cloud.google.com/container-optimized-os/docs/resources/support-policy#contact_us"
GOOGLE_METRICS_PRODUCT_ID=26
KERNEL_COMMIT_ID=2b9ef6b5f4f1bbd5e0ae7d4a3ec0a0d0ab1d8b8b
GOOGLE_CRASH_ID=Lakitu
VERSION=113
VERSION_ID=113
BUILD_ID=17801.218.41
'''
LSB = "CHROMEOS_RELEASE_BOARD=lakitu\nCHROMEOS_RELEASE_TRACK=stable-channel\n"


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
    info = host_info_from_text(UBUNTU, None, UBUNTU_KERNEL)
    assert (info.os_id, info.family, info.version_id, info.kernel_release) == (
        "ubuntu", "ubuntu", "22.04", UBUNTU_KERNEL)
    assert info.build_id is None


def test_debian_follows_ubuntu_flow():
    info = host_info_from_text('ID=debian\nVERSION_ID="12"\n', None, "6.1.0-18-amd64")
    assert info.family == "ubuntu" and info.os_id == "debian"


def test_cos_build_and_board():
    info = host_info_from_text(COS, LSB, "6.1.58+")
    assert (info.family, info.build_id, info.version_id, info.board) == (
        "cos", "17801.218.41", "113", "lakitu")


@pytest.mark.parametrize(
    ("os_release", "needle"),
    [
        pytest.param(None, "cannot read", id="missing"),
        pytest.param("NAME=foo\n", "no ID", id="no-id"),
        pytest.param('ID=fedora\nPRETTY_NAME="Fedora Linux 40"\n', "unsupported host OS 'fedora'",
                     id="unknown"),
        pytest.param(COS.replace("BUILD_ID=17801.218.41\n", ""), "no BUILD_ID", id="cos-no-build"),
        pytest.param(COS.replace("17801.218.41", "latest"), "malformed BUILD_ID", id="cos-bad-build"),
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

    from installer.osinfo import shell_words

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
