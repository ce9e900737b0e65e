"""COS artifacts: URL templating, version aliases, toolchain location, existence probes."""

from __future__ import annotations

import pytest

from installer.base.errors import (
    DownloadError,
    ExitCode,
    IntegrityError,
    UnsupportedHostError,
    UsageError,
)
from installer.distros.cos import artifacts as ca
from installer.net.policy import UrlPolicy
from installer.net.session import make_session

BUILD = "17801.218.41"
BASE = f"https://storage.googleapis.com/cos-tools/{BUILD}"


# --------------------------------------------------------------------------- templating


@pytest.mark.parametrize("template, board, expected", [
    ("https://storage.googleapis.com/cos-tools/{build_id}", "lakitu", BASE),
    ("https://storage.googleapis.com/cos-tools/{build_id}/", None, BASE),
    ("https://mirror.example/cos/{board}/{build_id}", "lakitu",
     f"https://mirror.example/cos/lakitu/{BUILD}"),
    ("https://mirror.example/fixed", None, "https://mirror.example/fixed"),
    ("file:///srv/cos/{build_id}", None, f"file:///srv/cos/{BUILD}"),
])
def test_artifacts_base(template, board, expected):
    assert ca.artifacts_base(template, build_id=BUILD, board=board) == expected


def test_board_placeholder_without_board_is_a_host_problem():
    with pytest.raises(UnsupportedHostError, match="CHROMEOS_RELEASE_BOARD") as err:
        ca.artifacts_base("https://m.example/{board}/{build_id}", build_id=BUILD, board=None)
    assert err.value.exit_code == ExitCode.UNSUPPORTED_HOST
    assert err.value.context["path"] == "/etc/lsb-release"


def test_unknown_placeholder_is_usage():
    with pytest.raises(UsageError, match=r"\{milestone\}"):
        ca.artifacts_base("https://m.example/{milestone}/{build_id}", build_id=BUILD, board="x")


def test_artifact_names():
    assert ca.prebuilt_modules_name("535.183.01") == "nvidia-drivers-535.183.01.tgz"
    assert ca.version_file_name("R535") == "gpu_R535_version"
    assert ca.join(BASE + "/", "/kernel-headers.tgz") == f"{BASE}/kernel-headers.tgz"


# --------------------------------------------------------------------------- versions


@pytest.mark.parametrize("raw, version, alias", [
    (None, None, "default"),
    ("", None, "default"),
    ("default", None, "default"),
    ("DEFAULT", None, "default"),
    ("latest", None, "latest"),
    ("R535", None, "R535"),
    ("r470", None, "R470"),
    ("535", None, "R535"),
    ("535.183.01", "535.183.01", None),
    ("550.54", "550.54", None),
])
def test_parse_requested(raw, version, alias):
    req = ca.parse_requested(raw)
    assert (req.version, req.alias) == (version, alias)


@pytest.mark.parametrize("raw", ["newest", "R", "5x5.1", "535.183.01; rm -rf /", "../gpu"])
def test_bad_requests_are_usage_errors(raw):
    with pytest.raises(UsageError, match="neither a driver version nor a COS alias"):
        ca.parse_requested(raw)


def _fetcher(files: dict[str, str]):
    asked = []

    def fetch(name):
        asked.append(name)
        return files.get(name)

    fetch.asked = asked
    return fetch


@pytest.mark.parametrize("raw, expected, file", [
    ("default", "535.183.01", "gpu_default_version"),
    (None, "535.183.01", "gpu_default_version"),
    ("latest", "550.54.14", "gpu_latest_version"),
    ("R550", "550.54.14", "gpu_R550_version"),
    ("535", "535.183.01", "gpu_R535_version"),
])
def test_alias_resolution(raw, expected, file):
    fetch = _fetcher({"gpu_default_version": "535.183.01\n", "gpu_latest_version": "550.54.14",
                      "gpu_R535_version": " 535.183.01 \n", "gpu_R550_version": "550.54.14\n"})
    resolved = ca.resolve_version(ca.parse_requested(raw), fetch, base=BASE, build_id=BUILD)
    assert resolved.version == expected
    assert resolved.source_url == f"{BASE}/{file}"
    assert fetch.asked == [file]


def test_explicit_version_reads_nothing():
    fetch = _fetcher({})
    resolved = ca.resolve_version(ca.parse_requested("535.104.05"), fetch, base=BASE,
                                  build_id=BUILD)
    assert resolved.version == "535.104.05" and resolved.alias is None
    assert fetch.asked == []


def test_missing_alias_names_build_alias_and_url():
    with pytest.raises(ca.MissingArtifactError) as err:
        ca.resolve_version(ca.parse_requested("R470"), _fetcher({}), base=BASE, build_id=BUILD)
    exc = err.value
    assert isinstance(exc, DownloadError) and exc.exit_code == ExitCode.DOWNLOAD == 5
    assert BUILD in exc.message and "'R470'" in exc.message
    assert f"{BASE}/gpu_R470_version" in exc.message
    assert exc.context == {"url": f"{BASE}/gpu_R470_version", "build_id": BUILD, "alias": "R470"}


@pytest.mark.parametrize("content", ["", "\n\n", "<html>NoSuchKey</html>", "latest"])
def test_malformed_alias_file_is_integrity(content):
    with pytest.raises(IntegrityError, match="does not hold a driver version"):
        ca.resolve_version(ca.parse_requested("default"),
                           _fetcher({"gpu_default_version": content}), base=BASE, build_id=BUILD)


# --------------------------------------------------------------------------- toolchain


def test_toolchain_location():
    assert ca.toolchain_location(None, BASE) == f"{BASE}/toolchain.tar.xz"
    url = "https://storage.googleapis.com/chromiumos-sdk/2023/x86_64-cros-linux-gnu-2023.tar.xz"
    assert ca.toolchain_location(url + "\n", BASE) == url
    assert ca.toolchain_location("gs://chromiumos-sdk/a/tc.tar.xz", BASE) == \
        "https://storage.googleapis.com/chromiumos-sdk/a/tc.tar.xz"
    root = "https://storage.googleapis.com/cos-tools"
    assert ca.toolchain_location("# comment\n../shared/tc.tar.xz\n", BASE, root) == \
        f"{root}/shared/tc.tar.xz"
    with pytest.raises(IntegrityError, match="empty"):
        ca.toolchain_location("\n  \n", BASE)


@pytest.mark.parametrize("location", [
    "file:///etc/shadow", "https://evil.example/tc.tar.xz", "http://storage.googleapis.com/x",
    "https://storage.googleapis.com:8443/x", "/etc/shadow", "../../../../etc/shadow",
    "ftp://storage.googleapis.com/x"])
def test_toolchain_location_from_the_bucket_is_policed(location):
    """toolchain_url is remote metadata: only inside the artifacts, or https on their origin."""
    with pytest.raises(IntegrityError, match="refusing the toolchain location") as err:
        ca.toolchain_location(location, BASE, "https://storage.googleapis.com/cos-tools")
    assert err.value.exit_code == 6


def test_toolchain_env():
    assert ca.parse_toolchain_env(None) == ca.DEFAULT_TOOLCHAIN_ENV
    env = ca.parse_toolchain_env('CC="x86_64-cros-linux-gnu-clang"\nCXX=x86_64-cros-linux-gnu-clang++\n'
                                 "LD=x86_64-cros-linux-gnu-ld.lld\n# c\n")
    assert env == {"CC": "x86_64-cros-linux-gnu-clang", "CXX": "x86_64-cros-linux-gnu-clang++",
                   "LD": "x86_64-cros-linux-gnu-ld.lld"}
    env = ca.parse_toolchain_env("CC=/t/bin/x86_64-cos-linux-gnu-gcc\nLLVM_IAS=1\nHOSTLD=ld.lld\n")
    assert env["CC"] == "/t/bin/x86_64-cos-linux-gnu-gcc" and env["LLVM_IAS"] == "1"


@pytest.mark.parametrize("line", [
    "CC=/bin/sh -c 'id'", "CC=gcc -wrapper /x", "KCFLAGS=-O2", "HOSTCC=gcc;id", "CXX=$(id)",
    "CC=`id`", "CC=-wrapper", "CC=a=b", "CC=/t/../../bin/sh", "CC=bin/gcc", "LLVM=/usr/bin/",
    "PATH=/tmp", "LD_PRELOAD=/x.so", "CROSS_COMPILE=x-", "CC=gcc|id", "CC=gcc&"])
def test_toolchain_env_names_tools_only(line):
    with pytest.raises(IntegrityError, match=line.split("=", 1)[0]) as err:
        ca.parse_toolchain_env(line + "\n", "https://u:secret@h/toolchain_env")
    assert err.value.exit_code == 6 and "secret" not in err.value.message


def test_tool_paths_must_be_inside_the_toolchain(tmp_path):
    from installer.distros.cos.toolchain import check_tool_paths

    check_tool_paths({"CC": f"{tmp_path}/bin/gcc", "CXX": "g++"}, tmp_path, "te")
    with pytest.raises(IntegrityError, match="LD=.*outside the toolchain"):
        check_tool_paths({"LD": "/usr/bin/ld"}, tmp_path, "te")
    with pytest.raises(IntegrityError, match="outside the toolchain"):
        check_tool_paths({"CC": f"{tmp_path}-evil/gcc"}, tmp_path, "te")


# --------------------------------------------------------------------------- access


def test_file_artifacts(tmp_path):
    build = tmp_path / BUILD
    build.mkdir()
    (build / "gpu_latest_version").write_text("550.54.14\n")
    (build / "nvidia-drivers-550.54.14.tgz").write_bytes(b"x")
    arts = ca.Artifacts(ca.artifacts_base(f"file://{tmp_path}/{{build_id}}", build_id=BUILD,
                                          board=None), BUILD, None, None)
    assert arts.resolve(ca.parse_requested("latest")).version == "550.54.14"
    assert arts.exists("nvidia-drivers-550.54.14.tgz")
    assert not arts.exists("nvidia-drivers-535.183.01.tgz")
    assert arts.fetch_text("toolchain_url") is None
    with pytest.raises(ca.MissingArtifactError):
        arts.resolve(ca.parse_requested("R470"))


def test_plain_http_artifacts_refused_unless_allowed():
    """The session carries the URL policy (net.policy.UrlPolicy)."""
    with pytest.raises(UsageError, match="plain http"):
        ca.Artifacts("http://mirror.example/cos/1.2.3", BUILD, None, make_session())
    allowed = make_session(url_policy=UrlPolicy(allow_insecure_http=True))
    ca.Artifacts("http://mirror.example/cos/1.2.3", BUILD, None, allowed)
