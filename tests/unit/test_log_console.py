"""The console log reads like a person's tool (issue 14); JSON keeps every field on every line."""

from __future__ import annotations

import io
import json

import pytest
import structlog

from installer import log as logmod
from installer.base.branches import EXAMPLE_BRANCH, EXAMPLE_VERSION
from installer.cli import main

OS_RELEASE = 'ID=ubuntu\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n'


@pytest.fixture(autouse=True)
def _fresh_context(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    structlog.contextvars.clear_contextvars()
    yield
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def _fixture_kernel(fake_kernel, monkeypatch):
    """``install --dry-run`` runs in this process on a fixture host root: its kernel is a
    fixture's too, never the machine's (issue 43: a GPU runner's loaded driver)."""
    from installer.kmod import kernel

    monkeypatch.setattr(kernel, "_roots", fake_kernel.roots())


def _console(capsys, fmt="console", level="info") -> list[str]:
    logmod.configure(fmt, level)
    lg = structlog.get_logger("t")
    structlog.contextvars.bind_contextvars(os="ubuntu", kernel_release="5.15.0-1049-gke")
    lg.info("host_detected", family="ubuntu")
    lg.info("step_finished", step="prepare_staging", duration_s=0.0, hint=None)
    structlog.contextvars.bind_contextvars(kernel_release="6.1.0-56-cloud-amd64")
    lg.info("plan_ready", steps=[f"step_number_{i}" for i in range(40)])
    lg.error("install_failed", error_class="build", exit_code=7, error="it broke",
             hint="read the log", step="build_driver", path="/x",
             message="FAILED in step build_driver (build, exit 7): it broke. What to do: read "
             "the log.")
    return capsys.readouterr().err.splitlines()


def test_context_shows_once_and_again_when_it_changes(capsys):
    lines = _console(capsys)
    assert lines[0].endswith(" info    host_detected family=ubuntu "
                             "kernel_release=5.15.0-1049-gke os=ubuntu")
    assert lines[1].endswith(" info    step_finished step=prepare_staging duration_s=0.0")
    assert "kernel_release=6.1.0-56-cloud-amd64" in lines[2] and " os=" not in lines[2]


def test_none_fields_are_left_out_and_an_error_is_printed_once(capsys):
    lines = _console(capsys)
    text = "\n".join(lines)
    assert "None" not in text
    assert text.count("it broke") == 1 and text.count("read the log") == 1
    assert lines[-2].endswith(" error   install_failed path=/x")
    assert lines[-1] == ("FAILED in step build_driver (build, exit 7): it broke. What to do: "
                         "read the log.")


def test_long_values_fit_the_terminal_unless_verbose(capsys):
    plan = _console(capsys)[2]
    assert len(plan) == 100 and "step_numbe… kernel_release=" in plan
    verbose = [ln for ln in _console(capsys, level="debug") if "plan_ready" in ln][0]
    assert "step_number_39" in verbose and len(verbose) > 500


def test_no_color_without_a_terminal_and_with_no_color(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert logmod.colors_wanted(Tty()) is True
    assert logmod.colors_wanted(io.StringIO()) is False
    monkeypatch.setenv("NO_COLOR", "1")
    assert logmod.colors_wanted(Tty()) is False
    painted = logmod.ConsoleRenderer(colors=True, verbose=False)(None, "info", {"event": "x"})
    plain = logmod.ConsoleRenderer(colors=False, verbose=False)(None, "info", {"event": "x"})
    assert "\x1b[" in painted and "\x1b[" not in plain


def test_json_keeps_every_field_on_every_line(capsys):
    events = [json.loads(ln) for ln in _console(capsys, fmt="json")]
    assert all(e["os"] == "ubuntu" for e in events)
    assert events[1]["hint"] is None and events[2]["steps"][-1] == "step_number_39"
    assert events[-1]["error"] == "it broke"


# -- CLI runs: exit code, the exact last line, no traceback --------------------------------


def _run(capsys, tmp_path, *args: str) -> tuple[int, list[str]]:
    (tmp_path / "etc").mkdir(exist_ok=True)
    if not (tmp_path / "etc/os-release").exists():
        (tmp_path / "etc/os-release").write_text(OS_RELEASE)
    with pytest.raises(SystemExit) as info:
        # The install dir is <host-root>/<the default --install-dir-host>, as the pod mounts it.
        main(["install", "--host-root", str(tmp_path),
              "--install-dir", str(tmp_path / "home/kubernetes/bin/nvidia"),
              "--dry-run", "--log-format", "console", *args])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return info.value.code, err.splitlines()


def test_a_kernel_release_with_a_path_in_it_is_a_usage_error(capsys, tmp_path):
    code, lines = _run(capsys, tmp_path, "--kernel-release", "5.15/../../etc")
    assert code == 2
    assert lines[-1] == (
        "FAILED (usage, exit 2): --kernel-release '5.15/../../etc' is not a kernel release. What "
        "to do: give the node's `uname -r`, e.g. 5.15.0-1049-gke (letters, digits and . - _ + "
        "~, at most 64 characters).")
    assert sum("5.15/../../etc" in ln for ln in lines) == 1


@pytest.mark.parametrize("release", ["5.15.0-1049-gke", "6.1.0-56-cloud-amd64", "6.6.68+",
                                     "4.19.0~rc1", "5.4.0_custom"])
def test_real_kernel_releases_pass(capsys, monkeypatch, tmp_path, fake_kernel, release):
    fake_kernel.add_gpu()  # the dry run refuses a node without one, as the real run's load does
    fake_kernel.activate(monkeypatch)
    code, lines = _run(capsys, tmp_path, "--kernel-release", release)
    assert code == 0, lines[-3:]


def test_a_huge_driver_version_is_echoed_cut_and_once(capsys, tmp_path):
    code, lines = _run(capsys, tmp_path, "--kernel-release", "5.15.0-1049-gke",
                       "--driver-version", "9" * 10_000)
    assert code == 2
    assert lines[-1] == (f"FAILED (usage, exit 2): not a driver version: '{'9' * 80}…'. What to "
                         f"do: use a version such as {EXAMPLE_VERSION} (COS also takes default, "
                         f"latest, {EXAMPLE_BRANCH}).")
    assert sum(ln.count("9" * 80) for ln in lines) == 1 and all(len(ln) < 300 for ln in lines)


def test_an_os_release_without_id_says_what_to_pass(capsys, tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/os-release").write_text("NAME=whatever\n")
    code, lines = _run(capsys, tmp_path, "--kernel-release", "5.15.0-1049-gke")
    assert code == 3
    assert lines[-1] == (
        f"FAILED (unsupported_host, exit 3): {tmp_path}/etc/os-release has no ID field. What to "
        "do: point --host-root (ROOT_MOUNT_DIR) at the node's root filesystem, whose "
        "/etc/os-release names the OS in an ID= line (e.g. ID=cos or ID=ubuntu).")


@pytest.mark.parametrize("columns_env", ["0", None])
def test_a_terminal_reporting_zero_columns_gets_the_fallback_width(monkeypatch, columns_env):
    """Issue 34 §5: a terminal of 0 columns (a serial console, `script`) cut every value to
    its 16-character minimum; 0 means unknown, so the fallback width applies."""
    import os

    if columns_env is None:
        monkeypatch.delenv("COLUMNS")
    else:
        monkeypatch.setenv("COLUMNS", columns_env)
    monkeypatch.setattr(os, "get_terminal_size", lambda fd=None: os.terminal_size((0, 0)))
    assert logmod._width() == logmod.FALLBACK_WIDTH
