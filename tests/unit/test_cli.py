"""CLI contract: option/env names, usage errors exit 2 with one line, no traceback."""

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from installer.cli import cli, main


@pytest.fixture(autouse=True)
def _fixture_kernel(fake_kernel, monkeypatch):
    """The CLI runs in this process on a fixture host root: its kernel is a fixture's too
    (a fresh FakeKernel, no GPU), never the machine's (issue 43: on a GPU runner ``status``
    and ``detect`` would report the runner's loaded driver). In this process only: the
    children these tests start are measured as the installed CLI starts (no start-up hook)."""
    from installer.kmod import kernel

    monkeypatch.setattr(kernel, "_roots", fake_kernel.roots())


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
        pytest.param(["--module-arg", "nvidia"], "'nvidia' is not MODULE.PARAM=VALUE",
                     id="bad-module-arg"),
        pytest.param(["--driver-base-url", "http://127.0.0.1:1/x"], "--allow-insecure-http", id="http"),
        pytest.param(["--driver-url", "ftp://x/y.run"], "ftp", id="scheme"),
        pytest.param(["--lock-timeout", "-1"], "lock-timeout", id="negative-timeout"),
        pytest.param(["--no-such-flag"], "No such option", id="unknown-flag"),
        pytest.param(["--download-deadline", "0"], "download-deadline", id="zero-deadline"),
        pytest.param(["--download-min-rate", "-1"], "download-min-rate", id="negative-rate"),
        pytest.param(["--install-dir-host", "/../../etc"], "without '..'", id="dotdot-dir"),
        # issue 26: conflicting options, refused before anything happens
        pytest.param(["--driver-url", "https://h/NVIDIA-Linux-x86_64-550.54.14.run",
                      "--driver-base-url", "https://h/tesla"], "give one", id="url-and-base-url"),
        pytest.param(["--module-arg", "foo.bar=1"], "never loads", id="module-never-loaded"),
        pytest.param(["--module-arg", "nvidia-uvm.uvm_perf_prefetch_enable=0",
                      "--module-arg", "nvidia_peermem.x=1"], "'nvidia_peermem'",
                     id="module-not-ours"),
        pytest.param(["--driver-version", "390.157"], "older than this installer supports",
                     id="too-old-driver"),
        pytest.param(["--driver-url", "https://h/NVIDIA-Linux-x86_64-550.127.05.run",
                      "--driver-version", "550.54.14"], "names driver 550.127.05",
                     id="url-names-another-version"),
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
    envvars = {p.envvar for p in cli.get_command(click.Context(cli), "install").params if p.envvar}
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
    from installer.commands import install as install_flow

    def bug(settings):
        raise RuntimeError(f"boom fetching {settings.driver_url}")

    monkeypatch.setattr(install_flow, "run", bug)
    url = "https://u:Hunter2pass@h.example/x/NVIDIA-Linux-x86_64-550.54.14.run?sig=Sig9secret"
    code, _, err = run_main(capsys, ["install", "--host-root", str(tmp_path), "--driver-url", url])
    assert code == 1 and "Traceback" in err and "RuntimeError: boom" in err
    assert "Hunter2pass" not in err and "Sig9secret" not in err
    final = last_event(err)  # then one final `internal` event
    assert final["error_class"] == "internal" and final["event"] == "install_failed"
    assert final["message"].startswith(
        "FAILED (internal, exit 1): RuntimeError: boom fetching https://***@h.example/")


def test_help_lists_commands(capsys):
    code, out, _ = run_main(capsys, ["--help"])
    assert code == 0
    for name in ("install", "detect", "verify", "status", "manifests"):
        assert name in out


def test_version_parsing():
    from installer.base.errors import UsageError
    from installer.driver.nvidia_options import check_version
    from installer.driver.nvidia_urls import version_from_url

    assert version_from_url("file:///x/NVIDIA-Linux-x86_64-550.54.14.run") == "550.54.14"
    assert version_from_url("https://m/NVIDIA-Linux-x86_64-535.183.01-custom.run?sig=1") == "535.183.01"
    for bad in ("../../etc", "latest", "550"):
        with pytest.raises(UsageError):
            check_version(bad)
    with pytest.raises(UsageError) as err:
        version_from_url("https://m/driver.run")
    assert "--driver-version" in err.value.hint


# -- issue 14: everyday mistakes end in one line and a documented exit code -----------------


def last_event(err: str) -> dict:
    import json

    return json.loads(err.strip().splitlines()[-1])


def failed(capsys, args, code):
    """Run with JSON logs; the exit code, no traceback, and the final event's one line."""
    got, out, err = run_main(capsys, [*args, "--log-format", "json"])
    assert got == code, err
    assert "Traceback" not in err
    message = last_event(err)["message"]
    assert "\n" not in message
    return message, out


def ubuntu_root(tmp_path):
    host = tmp_path / "host"
    (host / "etc").mkdir(parents=True)
    (host / "etc/os-release").write_text('ID=ubuntu\nVERSION_ID="22.04"\n')
    return host


@pytest.mark.parametrize("command", [["status"], ["doctor"], ["install", "--dry-run"]])
def test_install_dir_naming_a_file_is_a_usage_error(capsys, tmp_path, command):
    host = ubuntu_root(tmp_path)
    (tmp_path / "afile").write_text("")
    message, _ = failed(capsys, [*command, "--host-root", str(host), "--install-dir",
                                 str(tmp_path / "afile")], 2)
    assert message == (
        f"FAILED (usage, exit 2): --install-dir {tmp_path}/afile is not a directory. What to do: "
        "name the driver's install dir (NVIDIA_INSTALL_DIR_CONTAINER / NVIDIA_INSTALL_DIR_HOST), "
        "not a file in it.")


@pytest.mark.parametrize(("content", "what"), [
    ("[1, 2]", "holds a JSON list, not an object"),
    ("{not json", "is not valid JSON: Expecting property name enclosed in double quotes: "
                  "line 1 column 2 (char 1)"),
    ("[" * 100_000, "is nested more than 64 levels deep"),
])
def test_status_with_a_corrupt_status_file(capsys, tmp_path, content, what):
    (tmp_path / "status.json").write_text(content)
    message, _ = failed(capsys, ["status", "--host-root", str(tmp_path), "--install-dir",
                                 str(tmp_path)], 6)
    assert message == (f"FAILED (integrity, exit 6): corrupt status file: {tmp_path}/status.json "
                       f"{what}. What to do: remove it; the next install writes a new one.")


def test_status_when_the_installer_never_ran(capsys, tmp_path):
    message, out = failed(capsys, ["status", "--host-root", str(tmp_path), "--install-dir",
                                   str(tmp_path), "-o", "json"], 12)
    assert message == (
        f"FAILED (not_installed, exit 12): the installer has not run on this node (no status.json "
        f"in {tmp_path}). What to do: run install, or check --install-dir / "
        "NVIDIA_INSTALL_DIR_CONTAINER names the driver's install dir.")
    assert '"last_run": null' in out


def test_status_prints_text_by_default_and_exits_with_the_runs_code(capsys, tmp_path):
    (tmp_path / "status.json").write_text('{"outcome": "error", "exit_code": 5}')
    code, out, _ = run_main(capsys, ["status", "--host-root", str(tmp_path), "--install-dir",
                                     str(tmp_path)])
    assert code == 5
    assert out.splitlines() == [f"install_dir: {tmp_path}", "last_run:", "  outcome: error",
                                "  exit_code: 5", "cache: -"]


def failed_in(wrapper, args, code):
    """``failed`` for the CLI run as a child process under ``wrapper`` (setpriv, unshare)."""
    proc = subprocess.run([*wrapper, sys.executable, "-m", "installer", *args, "--log-format",
                           "json"], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"]})
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    return last_event(proc.stderr)["message"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to drop to an unprivileged user with setpriv")
@pytest.mark.parametrize("command", ["install", "uninstall"])
def test_without_root_privileges(command):
    """A real unprivileged user (nobody): the host lock's dir cannot be created."""
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp") as top:  # pytest's tmp dirs are root-only
        host = ubuntu_root(Path(top))
        for path in (Path(top), host, host / "etc"):
            path.chmod(0o755)
        message = failed_in(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"],
                            [command, "--host-root", str(host), "--install-dir", top], 2)
    assert message == (
        "FAILED (usage, exit 2): permission denied on /tmp/cos_gpu_installer_lock: the installer "
        "needs root privileges. What to do: run as root on the node, or in a privileged container "
        "(the DaemonSet's securityContext.privileged: true).")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) for a read-only bind mount")
def test_a_read_only_host_root(tmp_path):
    host = ubuntu_root(tmp_path)
    (host / "tmp").mkdir(mode=0o1777)
    script = (f"mount --make-rprivate / && mount --bind {host} {host} && "
              f"mount -o remount,bind,ro {host} && exec \"$@\"")
    message = failed_in(["unshare", "--mount", "sh", "-c", script, "sh"],
                        ["install", "--host-root", str(host), "--install-dir", str(tmp_path)], 3)
    assert message == (
        "FAILED (unsupported_host, exit 3): read-only file system on /tmp/cos_gpu_installer_lock: "
        "the installer writes to the host root. What to do: mount the host's / read-write "
        "(the pod's /root volume must not be readOnly).")


@pytest.mark.skipif(not Path("/etc/os-release").is_file() or Path("/root/etc/os-release").exists(),
                    reason="needs this machine's /etc/os-release and no /root/etc/os-release")
def test_default_host_root_by_hand_on_a_node_says_pass_host_root_slash(capsys, monkeypatch,
                                                                        tmp_path):
    from installer import distros

    monkeypatch.setattr(distros, "CONTAINER_MARKERS", ())  # as on a node, outside containers
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    message, _ = failed(capsys, ["detect", "--install-dir", str(tmp_path)], 3)
    assert message == (
        "FAILED (unsupported_host, exit 3): cannot read /root/etc/os-release: --host-root is "
        "/root, but this runs on the node itself, not in the installer's pod. What to do: pass "
        "--host-root / (or ROOT_MOUNT_DIR=/) when running on the node by hand.")


def test_help_summaries_are_whole_and_install_help_has_exit_codes_and_examples(capsys):
    _, out, _ = run_main(capsys, ["--help"])
    assert "…" not in out and "..." not in out.split("Commands:")[1]
    assert "Install or load the cached driver; verify it (nvidia-smi, CUDA)." in out
    _, out, _ = run_main(capsys, ["install", "--help"])
    assert "Exit codes:" in out and "     12  status: the installer has not run on this node" in out
    assert "sudo nvidia-driver-installer install --host-root / --dry-run" in out


@pytest.mark.parametrize("command", ["status", "verify", "doctor", "install", "uninstall"])
def test_every_result_command_takes_output_text_or_json(command):
    option = next(p for p in cli.get_command(click.Context(cli), command).params if p.name == "output")
    assert option.opts == ["-o", "--output"] and option.default == "text"
    assert list(option.type.choices) == ["text", "json"]


def test_detect_output_is_auto_json_for_tools_text_on_a_terminal(capsys, tmp_path):
    """docs/contract.md §3 (detect prints JSON) and issue 14 (text for people) both hold."""
    option = next(p for p in cli.get_command(click.Context(cli), "detect").params if p.name == "output")
    assert option.default == "auto" and list(option.type.choices) == ["auto", "text", "json"]
    _, out, _ = run_main(capsys, ["detect", "--help"])
    assert "auto: JSON when stdout is not a terminal" in " ".join(out.split())
    host = debian_root(tmp_path)
    args = ["detect", "--host-root", str(host), "--install-dir", str(tmp_path),
            "--kernel-release", "6.1.0-28-cloud-amd64"]
    code, out, _ = run_main(capsys, args)  # captured: not a terminal
    assert code == 0
    assert json.loads(out)["os_id"] == "debian"
    code, out, _ = run_main(capsys, [*args, "-o", "text"])
    assert code == 0 and "os_id: debian\n" in out


def debian_root(tmp_path, os_id="debian", id_like=""):
    host = tmp_path / "host"
    (host / "etc").mkdir(parents=True)
    (host / "etc/os-release").write_text(f'ID={os_id}\n{id_like}VERSION_ID="12"\n'
                                         'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')
    return host


@pytest.mark.parametrize(("os_id", "id_like", "flow", "support"), [
    ("debian", "", "debian", "supported"),
    ("ubuntu", "", "ubuntu", "supported"),
    ("pop", 'ID_LIKE="ubuntu debian"\n', "ubuntu", "not tested: pop follows the Ubuntu flow "
     "because its os-release ID_LIKE names ubuntu"),
    ("raspbian", 'ID_LIKE="debian"\n', "debian", "not tested: raspbian follows the Debian flow "
     "because its os-release ID_LIKE names debian"),
])
def test_detect_says_which_flow_serves_the_host_and_how(capsys, tmp_path, os_id, id_like,
                                                       flow, support):
    host = debian_root(tmp_path, os_id, id_like)
    code, out, err = run_main(capsys, ["detect", "--host-root", str(host), "--install-dir",
                                       str(tmp_path), "-o", "json"])
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["os_id"], doc["flow"], doc["support"]) == (os_id, flow, support)
    assert "distro" not in doc and "family" not in doc  # "flow" names it


def test_detect_on_an_unknown_distro_exits_3_with_what_is_supported(capsys, tmp_path):
    host = debian_root(tmp_path, "fedora")
    message, out = failed(capsys, ["detect", "--host-root", str(host), "--install-dir",
                                   str(tmp_path)], 3)
    assert out == ""
    assert message == ("FAILED (unsupported_host, exit 3): unsupported host OS 'fedora' (Debian "
                       "GNU/Linux 12 (bookworm)). What to do: supported: Container-Optimized OS "
                       "(ID=cos), Ubuntu (ID=ubuntu), Debian (ID=debian).")


@pytest.mark.parametrize(("message", "hint"), [
    ("no space left on the install dir's file system, size.", "free some space."),
    ("no space left", "free some space"),
])
def test_failure_message_ends_each_sentence_with_one_full_stop(message, hint):
    from installer.base.errors import DiskSpaceError
    from installer.exits import failure_message

    assert failure_message(DiskSpaceError(message, hint=hint)) == (
        "FAILED (disk_space, exit 11): no space left"
        + (" on the install dir's file system, size." if message.endswith(".") else ".")
        + " What to do: free some space.")


def test_readme_exit_codes_table_lists_every_exit_code():
    import re

    from installer.base.errors import EXIT_CODE_MEANINGS, ExitCode

    reference = Path(__file__).resolve().parents[2] / "docs/operator/reference.md"
    text = reference.read_text()  # moved from the README (issue 41)
    table = text[text.index("### Exit codes"):]
    rows = {int(n) for row in re.findall(r"^\| (\d+)(?: / (\d+))? \|", table, re.M) for n in row if n}
    assert rows == {int(c) for c in ExitCode} == {int(c) for c in EXIT_CODE_MEANINGS}


def test_durations_and_log_format_spellings_are_accepted(capsys, monkeypatch, tmp_path):
    """Issue 26: LOCK_TIMEOUT=10m and LOG_FORMAT=JSON were refused."""
    from installer.commands import install as install_mod
    from installer.records.outcome import Outcome

    seen = {}
    monkeypatch.setattr(install_mod, "run",
                        lambda settings: seen.setdefault("s", settings) and Outcome("ok"))
    code, _, err = run_main(capsys, ["install", "--host-root", str(tmp_path)], monkeypatch,
                            env={"LOCK_TIMEOUT": "10m", "LOG_FORMAT": "JSON",
                                 "DOWNLOAD_DEADLINE": "1h", "DOWNLOAD_MIN_RATE_TIME": "90s"})
    assert code == 0, err
    s = seen["s"]
    assert (s.lock_timeout_s, s.download_deadline_s, s.download_min_rate_time_s) == (600, 3600, 90)


@pytest.mark.parametrize("env, needle", [
    ({"LOCK_TIMEOUT": "soon"}, "'soon' is not a duration"),
    ({"DOWNLOAD_DEADLINE": "0m"}, "must be > 0 seconds"),
])
def test_a_bad_setting_with_json_logs_is_a_json_event(capsys, monkeypatch, tmp_path, env, needle):
    code, out, err = run_main(capsys, ["install", "--host-root", str(tmp_path)], monkeypatch,
                              env={"LOG_FORMAT": "json", **env})
    assert code == 2
    last = json.loads(err.strip().splitlines()[-1])
    assert (last["event"], last["error_class"], last["exit_code"]) == ("install_failed", "usage", 2)
    assert needle in last["error"] and "Traceback" not in err


@pytest.mark.parametrize(("code", "exit_code", "says"), [
    (errno.ENOSPC, 11, "no space left on device on /home/kubernetes/bin/nvidia/.cache"),
    (errno.EDQUOT, 11, "disk quota exceeded on /home/kubernetes/bin/nvidia/.cache"),
    (errno.EBUSY, 3, "device or resource busy on /home/kubernetes/bin/nvidia/.cache"),
    (errno.EIO, None, None),  # nothing known to say: a real bug's traceback, exit 1
])
def test_host_os_errors_become_their_exit_codes(code, exit_code, says):
    from installer.base.errors import from_os_error

    known = from_os_error(OSError(code, os.strerror(code), "/home/kubernetes/bin/nvidia/.cache"))
    if exit_code is None:
        assert known is None
    else:
        assert int(known.exit_code) == exit_code and known.message.startswith(says)
        assert known.hint and known.context["path"] == "/home/kubernetes/bin/nvidia/.cache"


@pytest.mark.parametrize(("service_host", "expected"), [("10.0.0.1", "stage"), ("", "fail"),
                                                        (None, "fail")])
def test_when_in_use_defaults_to_stage_in_a_pod_and_fail_by_hand(monkeypatch, service_host,
                                                                 expected):
    """Issue 34 §1: the kubelet sets KUBERNETES_SERVICE_HOST in every container; GKE's own
    DaemonSets set no WHEN_IN_USE, so in a pod the default must be stage."""
    from installer.commands import node_cli as commands_cli

    monkeypatch.delenv("WHEN_IN_USE", raising=False)
    if service_host is None:
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    else:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", service_host)
    ctx = commands_cli.install.make_context("install", ["--dry-run"])
    assert ctx.params["when_in_use"] == expected
    monkeypatch.setenv("WHEN_IN_USE", "fail")  # the variable still wins over the default
    assert commands_cli.install.make_context("install", []).params["when_in_use"] == "fail"


def test_install_help_says_when_in_use_defaults_differ_in_a_pod(capsys):
    _, out, _ = run_main(capsys, ["install", "--help"])
    assert "stage in a pod, where KUBERNETES_SERVICE_HOST is set; fail by" in " ".join(out.split())


def test_top_level_help_names_every_supported_os(capsys):
    from installer.distros import DISTROS

    _, out, _ = run_main(capsys, ["--help"])
    for distro in DISTROS:
        assert distro.title in " ".join(out.split()), distro.title


def test_install_help_lists_the_environment_only_variables(capsys):
    from installer.base.envvars import ENV_RETRIES, ENV_TIMEOUT

    _, out, _ = run_main(capsys, ["install", "--help"])
    assert ENV_RETRIES in out and ENV_TIMEOUT in out


def test_every_variable_the_source_reads_is_in_the_readme():
    """Issue 34 §5: GCE_METADATA_HOST, CC, CURL_CA_BUNDLE were read but documented nowhere."""
    import re

    root = Path(__file__).resolve().parents[2]
    read = set()
    for path in (root / "installer").rglob("*.py"):
        read |= set(re.findall(r"""(?:environ\.get\(|environ\[|getenv\()["']([A-Z][A-Z0-9_]+)["']""",
                               path.read_text()))
    assert {"GCE_METADATA_HOST", "CC", "CURL_CA_BUNDLE"} <= read  # the pattern finds them
    # The operator's pages (the README's text until issue 41 moved it to docs/operator/).
    docs = "".join(p.read_text() for p in [root / "README.md", *(root / "docs/operator").glob("*.md")])
    assert not {v for v in read if f"`{v}`" not in docs}


@pytest.mark.parametrize("command", ["status", "verify", "doctor", "detect"])
def test_a_report_s_log_lines_follow_its_output_format(capsys, monkeypatch, tmp_path, command,
                                                      fake_kernel):
    """Issue 34 §5: text on stdout and JSON on stderr (LOG_FORMAT=json from a pod's env, or
    auto with stderr not a terminal) mixed two formats. -o picks both; --log-format wins.
    The reports read a fake kernel (doctor reads the kernel log: never the machine's)."""
    fake_kernel.activate(monkeypatch)
    monkeypatch.setenv("LOG_FORMAT", "json")
    args = [command, "--host-root", str(tmp_path), "--install-dir", str(tmp_path)]
    _, _, err = run_main(capsys, [*args, "-o", "text"])
    assert not [line for line in err.splitlines() if line.startswith("{")], err
    logs = bool(err.strip())  # doctor logs nothing here: its findings are its output
    assert logs or command == "doctor"
    for chosen in (["-o", "json"], ["-o", "text", "--log-format", "json"]):
        _, _, err = run_main(capsys, [*args, *chosen])
        assert not logs or err.strip().splitlines()[-1].startswith("{"), err


# What --help imports: measured in bench/cache_hit.py; here only which modules load.
REPO = Path(__file__).resolve().parents[2]
HEAVY_FOR_HELP = ("requests", "urllib3", "tenacity", "zstandard", "jinja2", "structlog", "rich",
                  "asyncio", "yaml", "pyseccomp", "installer.distros", "installer.commands.node_cli")


def imported_by(argv: list[str]) -> set[str]:
    """Every module ``python -X importtime -m installer ARGV`` imported (the names and
    their parent packages), from a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "installer", *argv],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            parts = name.split(".")
            names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return names


def test_help_imports_click_and_the_command_table_only():
    """``--help`` lists the commands from cli.COMMANDS: no command module, no network,
    archive, template or logging library is imported for it."""
    names = imported_by(["--help"])
    assert {"click", "installer.cli"} <= names  # the parse found the import lines
    assert sorted(names & set(HEAVY_FOR_HELP)) == []


def test_the_help_list_says_what_each_command_says_of_itself():
    """cli.COMMANDS's lines are what --help shows without loading the commands: each must be
    its command's own short help."""
    from installer.cli import COMMANDS

    context = click.Context(cli)
    for name, (line, _load) in COMMANDS.items():
        command = cli.get_command(context, name)
        assert command is not None and command.name == name
        assert command.get_short_help_str(limit=200) == line, name


@pytest.mark.parametrize("args", [["--help"], ["install", "--no-such-option"]])
def test_the_heap_is_frozen_before_the_interpreter_shuts_down(args):
    """cli.main freezes what the run made (gc.freeze), whatever the exit: the shutdown's
    collection walks none of it (docs/performance.md)."""
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 1000, file=sys.__stderr__))\n"
            "from installer.cli import main\n"
            f"main({args!r})\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert "frozen True" in proc.stderr, proc.stderr
