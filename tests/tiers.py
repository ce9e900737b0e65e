"""What the slow tiers' conftests share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def asked_for(config: pytest.Config, tier_dir: Path, env_var: str) -> bool:
    """True when the command line names ``tier_dir`` (or something in it), or ``env_var``
    is 1: a tier that is not asked for stays out of the way of a wider run."""
    if os.environ.get(env_var) == "1":
        return True
    root = Path(str(config.invocation_params.dir))
    for arg in config.args:
        path = (root / arg.split("::", 1)[0]).resolve()
        if path == tier_dir or tier_dir in path.parents:
            return True
    return False
