"""podcontract.DAEMONS (daemons.DAEMONS) is the one list of NVIDIA daemons run as sidecars: the install's
--require-daemon choices, doctor's daemon line, manifests render's sidecars and the
`sidecar` commands all come from (or are held to) it."""

from __future__ import annotations

import dataclasses

import click
import pytest

from installer.base import podcontract
from installer.commands.manifests import render
from installer.services import supervise as daemons


def _option(command: click.Command, name: str) -> click.Parameter:
    return next(p for p in command.params if p.name == name)


def test_the_install_and_verify_choices_are_the_registry():
    from installer.cli import cli

    for name in ("install", "verify"):
        command = cli.get_command(click.Context(cli), name)  # loaded when it runs
        assert command is not None
        choice = _option(command, "required_daemons").type
        assert isinstance(choice, click.Choice)
        assert tuple(choice.choices) == daemons.NAMES == ("fabricmanager", "persistenced")


def test_every_daemon_has_its_sidecar_command_and_render_flag():
    from installer.commands.manifests.cli import render_command
    from installer.commands.sidecar_cli import sidecar

    flags = {o for p in render_command.params for o in p.opts}
    fields = {f.name for f in dataclasses.fields(render.RenderOptions)}
    for daemon in daemons.DAEMONS:
        assert daemon.command in sidecar.commands
        assert f"--{daemon.render_flag}" in flags and daemon.render_flag in fields


@pytest.mark.parametrize("added", [False, True])
def test_render_draws_each_daemon_from_the_registry(monkeypatch, added):
    """A daemon added to the registry is rendered as a sidecar and required for readiness,
    with no other change to render."""
    opts = render.RenderOptions(nvswitch=True, persistenced=True)
    if added:
        extra = podcontract.Daemon("dcgm", "dcgm", "nvidia-dcgm", "nv-hostengine", "persistenced",
                               ("a third daemon",))
        monkeypatch.setattr(podcontract, "DAEMONS", (*podcontract.DAEMONS, extra))
    drawn = render.sidecars(opts)
    assert [s["daemon"] for s in drawn] == [d.name for d in podcontract.DAEMONS]
    assert [(s["name"], s["command"]) for s in drawn][:2] == [
        ("nvidia-fabricmanager", "fabric-manager"), ("nvidia-persistenced", "persistenced")]
    assert drawn[0]["why"][0].startswith("NVIDIA's fabric manager")
