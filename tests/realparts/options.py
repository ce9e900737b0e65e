"""The nvidia-installer option table a given driver version accepts.

The tables (tests/fixtures/nvidia_installer_options.json) were read from
NVIDIA/nvidia-installer's option_table.h at release tags. A version that is not
tabulated gets the table of the greatest tabulated version not newer than it,
from its own branch when there is one (options come and go per branch).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.realparts.provision import version_key

OPTIONS_FILE = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia_installer_options.json"


def option_table(version: str, path: Path = OPTIONS_FILE) -> dict:
    """{"release", "ref", "notes", "options"} for nvidia-installer <version>."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the option tables of nvidia-installer")
    tables = json.loads(path.read_text())["versions"]
    older = [v for v in tables if version_key(v) <= version_key(version)]
    branch = [v for v in older if v.split(".")[0] == version.split(".")[0]]
    if not older:
        raise LookupError(f"no option table for {version} or older in {path} (have {sorted(tables)})")
    release = max(branch or older, key=version_key)
    t = tables[release]
    return {"release": release, "ref": t["ref"], "notes": t.get("notes", []), "options": t["options"]}
