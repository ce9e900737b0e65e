"""Command line: flags and env vars in, exit codes out.

This is the only place errors become exit codes (docs/contract.md §3). The commands load
only when one runs: ``--help`` lists them from the table below, without importing them,
and each command imports only what it uses (a cache hit, the common run, stays fast).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

import click

from installer import __version__
from installer.base.errors import ExitCode, InstallerError


def _node_command(name: str) -> click.Command:
    from installer.commands import node_cli as commands_cli

    command: click.Command = getattr(commands_cli, name)
    return command


def _manifests() -> click.Command:
    from installer.commands.manifests.cli import manifests

    return manifests


def _bundle() -> click.Command:
    from installer.commands.bundle_cli import bundle

    return bundle


def _sidecar() -> click.Command:
    from installer.commands.sidecar_cli import sidecar

    return sidecar


# name -> (the line --help shows, the loader). A unit test holds each line to its command's
# own short_help (tests/unit/test_cli.py).
COMMANDS: dict[str, tuple[str, Callable[[], click.Command]]] = {
    "bundle": ("Build precompiled driver bundles once per kernel; index them.", _bundle),
    "detect": ("Print the detected host: OS, kernel, flow, GPUs, loaded driver.",
               lambda: _node_command("detect")),
    "doctor": ("Check the node's driver set-up; print each finding with its fix.",
               lambda: _node_command("doctor")),
    "install": ("Install or load the cached driver; verify it (nvidia-smi, CUDA).",
                lambda: _node_command("install")),
    "manifests": ("Kubernetes manifests: the DaemonSets, the bundle build Job.", _manifests),
    "sidecar": ("Run an NVIDIA daemon as the DaemonSet's sidecar.", _sidecar),
    "status": ("Print status.json and the .cache record; exit with its code.",
               lambda: _node_command("status")),
    "uninstall": ("Unload the modules and remove the install; keep logs and status.",
                  lambda: _node_command("uninstall")),
    "verify": ("Check the device nodes, nvidia-smi and CUDA (exit 9 if broken).",
               lambda: _node_command("verify")),
}


class _LazyGroup(click.Group):
    """Subcommands loaded only when used: the list (``--help``) comes from ``COMMANDS``."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        entry = COMMANDS.get(name)
        return entry[1]() if entry else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][0]) for name in self.list_commands(ctx)])


@click.group(cls=_LazyGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="nvidia-driver-installer")
def cli() -> None:
    """Install NVIDIA GPU drivers on Kubernetes nodes (Container-Optimized OS, Ubuntu,
    Debian)."""


def _command_name(argv: list[str]) -> str:
    names = set(cli.list_commands(click.Context(cli)))
    return next((a for a in argv if a in names), "command")


def main(argv: list[str] | None = None) -> None:
    """Run a command; the only place outcomes become exit codes (docs/contract.md §3). The failure
    reports (``exits``) load only when a command fails: ``--help`` stays fast."""
    from installer.base import startup
    from installer.base.lazyimport import defer_unused

    defer_unused()  # before any command imports structlog
    argv = sys.argv[1:] if argv is None else argv
    try:
        _run(argv)
    finally:
        startup.before_exit()


def _run(argv: list[str]) -> None:
    from installer.base import signals

    command = _command_name(argv)
    with signals.handled(), _guarded_output():
        try:
            rv = cli.main(args=argv, prog_name="nvidia-driver-installer", standalone_mode=False)
        except click.exceptions.Abort:
            click.echo("aborted", err=True)
            sys.exit(int(ExitCode.INTERNAL))
        except click.ClickException as exc:
            from installer import exits

            exits.report_click_error(exc, command, argv)
            sys.exit(exc.exit_code)
        except InstallerError as exc:
            from installer import exits

            exits.report_failure(exc, command, argv)
            sys.exit(int(exc.exit_code))
        except signals.Interrupted as exc:
            from installer import exits

            exits.report_interrupt(exc, command, argv)
            sys.exit(exc.exit_code)
        except Exception as exc:  # noqa: BLE001 - the one boundary
            from installer import exits
            from installer.base.errors import from_os_error

            known = from_os_error(exc) if isinstance(exc, OSError) else None
            if known is not None:  # no privileges, a read-only host: one line, no traceback
                exits.report_failure(known, command, argv)
                sys.exit(int(known.exit_code))
            exits.report_bug(exc, command, argv)
            sys.exit(int(ExitCode.INTERNAL))
    sys.exit(rv if isinstance(rv, int) else 0)


@contextlib.contextmanager
def _guarded_output() -> Iterator[None]:
    """stdout and stderr that never raise: the node's outcome is the same whether
    anyone reads the output or not. A lost stdout is said on stderr, once."""
    from installer.base.output import GuardedStream

    def stdout_lost(exc: OSError | ValueError) -> None:
        import structlog

        if structlog.is_configured():
            structlog.get_logger("installer").warning(
                "stdout_unwritable", error=str(exc) or type(exc).__name__,
                message="stdout is closed or unwritable: its output is dropped; the command "
                "goes on (see status.json for the outcome)")

    saved = sys.stdout, sys.stderr
    sys.stdout = GuardedStream(saved[0], stdout_lost)
    sys.stderr = GuardedStream(saved[1])
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout, sys.stderr = saved
