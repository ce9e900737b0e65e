"""CLI contract: option/env names, usage errors exit 2 with one line, no traceback."""

import pytest

from installer.cli import cli, main


def run_main(capsys, args, monkeypatch=None, env=None):
    if env and monkeypatch:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        pytest.param(["--driver-sha256", "abc"], "64 hex digits", id="bad-sha"),
        pytest.param(["--module-arg", "nvidia"], "bad --module-arg", id="bad-module-arg"),
        pytest.param(["--driver-base-url", "http://127.0.0.1:1/x"], "--allow-insecure-http", id="http"),
        pytest.param(["--driver-url", "ftp://x/y.run"], "ftp", id="scheme"),
        pytest.param(["--lock-timeout", "-1"], "lock-timeout", id="negative-timeout"),
        pytest.param(["--no-such-flag"], "No such option", id="unknown-flag"),
        pytest.param(["--download-deadline", "0"], "download-deadline", id="zero-deadline"),
        pytest.param(["--download-min-rate", "-1"], "download-min-rate", id="negative-rate"),
        pytest.param(["--install-dir-host", "/../../etc"], "without '..'", id="dotdot-dir"),
    ],
)
def test_usage_errors_exit_2(capsys, tmp_path, args, needle):
    code, _, err = run_main(capsys, ["install", "--host-root", str(tmp_path), *args])
    assert code == 2
    assert needle in err
    assert "Traceback" not in err


def test_env_vars_feed_options(capsys, monkeypatch, tmp_path):
    code, _, err = run_main(capsys, ["install", "--host-root", str(tmp_path)], monkeypatch,
                            env={"NVIDIA_DRIVER_SHA256": "xyz"})
    assert code == 2 and "64 hex digits" in err


def test_flag_wins_over_env(capsys, monkeypatch, tmp_path):
    # The env var is bad, the flag is good: the run gets past validation to host detection (3).
    code, _, err = run_main(
        capsys, ["install", "--host-root", str(tmp_path), "--driver-sha256", "a" * 64], monkeypatch,
        env={"NVIDIA_DRIVER_SHA256": "xyz", "LOG_FORMAT": "json"})
    assert code == 3, err
    assert "os-release" in err


def test_every_contract_env_var_is_an_install_option():
    envvars = {p.envvar for p in cli.commands["install"].params if p.envvar}
    assert {
        "ROOT_MOUNT_DIR", "NVIDIA_INSTALL_DIR_HOST", "NVIDIA_INSTALL_DIR_CONTAINER",
        "NVIDIA_DRIVER_VERSION", "NVIDIA_DRIVER_DOWNLOAD_URL", "NVIDIA_DRIVER_BASE_URL",
        "NVIDIA_DRIVER_SHA256", "COS_DOWNLOAD_GCS", "KERNEL_RELEASE", "KERNEL_SOURCE_PATH",
        "FORCE_REINSTALL", "LOCK_TIMEOUT", "LOG_FORMAT", "ALLOW_INSECURE_HTTP",
        "DOWNLOAD_DEADLINE", "DOWNLOAD_MIN_RATE", "DOWNLOAD_MIN_RATE_TIME", "COS_ARTIFACTS_SHA256",
    } <= envvars


def test_install_help_documents_the_security_options(capsys):
    code, out, _ = run_main(capsys, ["install", "--help"])
    assert code == 0
    for needle in ("--download-deadline", "DOWNLOAD_DEADLINE", "--download-min-rate",
                   "DOWNLOAD_MIN_RATE_TIME", "--cos-artifacts-sha256", "COS_ARTIFACTS_SHA256"):
        assert needle in out


def test_a_bug_traceback_is_shown_without_secrets(capsys, monkeypatch, tmp_path):
    from installer import install as install_flow

    def bug(settings):
        raise RuntimeError(f"boom fetching {settings.driver_url}")

    monkeypatch.setattr(install_flow, "run", bug)
    url = "https://u:Hunter2pass@h.example/x/NVIDIA-Linux-x86_64-550.54.14.run?sig=Sig9secret"
    code, _, err = run_main(capsys, ["install", "--host-root", str(tmp_path), "--driver-url", url])
    assert code == 1 and "Traceback" in err and "RuntimeError: boom" in err
    assert "Hunter2pass" not in err and "Sig9secret" not in err


def test_help_lists_commands(capsys):
    code, out, _ = run_main(capsys, ["--help"])
    assert code == 0
    for name in ("install", "detect", "verify", "status", "manifests"):
        assert name in out


def test_version_parsing():
    from installer.errors import UsageError
    from installer.nvidia_run import check_version, version_from_url

    assert version_from_url("file:///x/NVIDIA-Linux-x86_64-550.54.14.run") == "550.54.14"
    assert version_from_url("https://m/NVIDIA-Linux-x86_64-535.183.01-custom.run?sig=1") == "535.183.01"
    for bad in ("../../etc", "latest", "550"):
        with pytest.raises(UsageError):
            check_version(bad)
    with pytest.raises(UsageError) as err:
        version_from_url("https://m/driver.run")
    assert "--driver-version" in err.value.hint
