"""The option types both command lines share: the node's commands (node_cli) and the daemon
sidecars' (sidecar_cli). Neither imports the other: a sidecar starts without loading every
distro, and the node's commands without the sidecars' supervisor."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import click

LOG_FORMATS = click.Choice(["auto", "json", "console"], case_sensitive=False)


class Seconds(click.ParamType):
    """A duration: seconds (``600``, ``0.5``) or with a unit (``90s``, ``10m``, ``1h``), at
    least ``minimum`` (above it when ``open_min``)."""

    name = "seconds"
    _UNITS = {"": 1, "s": 1, "m": 60, "h": 3600}

    def __init__(self, minimum: float = 0.0, *, open_min: bool = False) -> None:
        self.minimum, self.open_min = minimum, open_min

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            seconds = float(value)
        else:
            text = str(value).strip().lower()
            number, unit = text.rstrip("smh"), text[len(text.rstrip("smh")):]
            try:
                seconds = float(number) * self._UNITS[unit]
            except (ValueError, KeyError):
                self.fail(f"{value!r} is not a duration: give seconds (600) or 90s, 10m, 1h",
                          param, ctx)
        too_small = seconds <= self.minimum if self.open_min else seconds < self.minimum
        if too_small or seconds != seconds or seconds == float("inf"):
            self.fail(f"{value!r} must be {'>' if self.open_min else '>='} {self.minimum:g} "
                      "seconds", param, ctx)
        return seconds


class HostPath(click.ParamType):
    """A path as the host sees it: absolute, without '..'."""

    name = "HOST_PATH"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> PurePosixPath:
        path = PurePosixPath(value)
        if not path.is_absolute() or ".." in path.parts:
            self.fail(f"must be an absolute host path without '..', got {str(value)!r}",
                      param, ctx)
        return path
