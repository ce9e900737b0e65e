"""Debian packages this machine's apt config does not enable, fetched without touching it.

NVIDIA's parts are in the archive's ``contrib``, ``non-free`` and
``non-free-firmware`` components, which CI machines do not enable. ``PrivateApt``
runs apt-get/apt-cache with a configuration of our own: a sources file derived
from this machine's enabled entries (same URIs, suites and signed-by; no mirror
is named here) with the components asked for, and lists/cache dirs of our own.
/etc/apt is never written. Used by the real-parts tier (tests/realparts/provision.py)
and by the default run's real nvidia-modprobe (tests/fixtures/realmodprobe.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.vm import provision as vm_provision

Log = Callable[[str], None]


class ProvisionError(RuntimeError):
    """The real parts cannot be had on this machine (tests skip or fail with this message)."""


def run(argv: list[str], *, log: Log | None = None, **kw) -> subprocess.CompletedProcess:
    if log:
        log("$ " + " ".join(argv))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C")
    cp = subprocess.run(argv, env=env, text=True, capture_output=True, **kw)
    if cp.returncode != 0:
        tail = (cp.stderr + cp.stdout)[-3000:]
        raise ProvisionError(f"command failed (rc={cp.returncode}): {' '.join(argv)}\n{tail}")
    return cp


class PrivateApt:
    """apt-get/apt-cache with a sources file and state dirs of our own."""

    def __init__(self, root: Path, log: Log, components: list[str],
                 extra_suites: tuple[str, ...] = (), architectures: tuple[str, ...] = ()) -> None:
        """``extra_suites``: suites of the host's main archive (same URI and key) this
        machine does not enable, e.g. trixie for NVIDIA's 550 parts. ``architectures``:
        the dpkg architectures to list (APT::Architectures), e.g. amd64 and arm64 for the
        arm64 tier; none: apt's default (this machine's own, as dpkg has it)."""
        self.root, self.log, self.components = root, log, components
        self.extra_suites = extra_suites
        self.architectures = architectures
        self.conf = root / "apt.conf"
        self.updated = False

    def configure(self) -> None:
        """Write the private config; forget the lists when the sources changed."""
        codename = vm_provision._host_codename()
        entries = vm_provision._apt_entries(codename)
        if not entries:
            raise ProvisionError(f"no enabled apt source for {codename} in /etc/apt")
        lines = []
        for e in entries:
            opt = f"[signed-by={e['signed_by']}] " if e["signed_by"] else ""
            line = f"deb {opt}{e['uri']} {e['suite']} {' '.join(self.components)}"
            if line not in lines:
                lines.append(line)
        main = next((e for e in entries if e["suite"] == codename), None)
        if self.extra_suites and main is None:
            raise ProvisionError(f"no apt source for the suite {codename} itself in /etc/apt")
        for suite in self.extra_suites:
            opt = f"[signed-by={main['signed_by']}] " if main["signed_by"] else ""
            lines.append(f"deb {opt}{main['uri']} {suite} {' '.join(self.components)}")
        sources = "\n".join(lines) + "\n"
        for d in ("lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        src_file = self.root / "sources.list"
        if not src_file.exists() or src_file.read_text() != sources:
            shutil.rmtree(self.root / "lists")
            (self.root / "lists/partial").mkdir(parents=True)
            src_file.write_text(sources)
        r = self.root
        arches = " ".join(f'"{a}";' for a in self.architectures)
        self.conf.write_text(
            f'Dir::State::Lists "{r}/lists";\n'
            f'Dir::Cache "{r}/cache";\n'
            f'Dir::Etc::SourceList "{src_file}";\n'
            f'Dir::Etc::SourceParts "{r}/sources.list.d";\n'
            f'Dir::Etc::PreferencesParts "{r}/preferences.d";\n'
            'APT::Sandbox::User "root";\n'
            + (f"APT::Architectures {{ {arches} }};\n" if arches else "")
        )

    def has_lists(self) -> bool:
        return any((self.root / "lists").glob("*_Packages*"))

    def update(self) -> None:
        t0 = time.monotonic()
        run(["apt-get", "-c", str(self.conf), "update", "-qq"], log=self.log)
        self.updated = True
        self.log(f"package lists read in {time.monotonic() - t0:.1f} s")

    def madison(self, pkgs: list[str]) -> dict[str, list[tuple[str, str]]]:
        """package -> [(Debian version, "uri suite/component")], newest first."""
        cp = run(["apt-cache", "-c", str(self.conf), "madison", *pkgs])
        found: dict[str, list[tuple[str, str]]] = {p: [] for p in pkgs}
        for line in cp.stdout.splitlines():
            parts = [x.strip() for x in line.split("|")]
            if len(parts) == 3 and parts[0] in found and parts[2].endswith("Packages"):
                source = " ".join(parts[2].split()[:2])
                if (parts[1], source) not in found[parts[0]]:
                    found[parts[0]].append((parts[1], source))
        return found

    def download(self, pins: dict[str, str], dest: Path) -> None:
        with tempfile.TemporaryDirectory(dir=dest, prefix=".dl-") as tmp:
            os.chmod(tmp, 0o755)
            run(
                ["apt-get", "-c", str(self.conf), "download", *(f"{p}={v}" for p, v in pins.items())],
                cwd=tmp,
                log=self.log,
            )
            for deb in Path(tmp).glob("*.deb"):
                name = run(["dpkg-deb", "-f", str(deb), "Package"]).stdout.strip()
                ver = run(["dpkg-deb", "-f", str(deb), "Version"]).stdout.strip()
                os.replace(deb, dest / deb_name(name, ver))


def deb_name(pkg: str, version: str) -> str:
    return f"{pkg}_{version.replace(':', '%3a')}.deb"


def upstream(debian_version: str) -> str:
    """535.261.03-1 -> 535.261.03; 1:2.0-3 -> 2.0."""
    v = debian_version.split(":", 1)[-1]
    return v.rsplit("-", 1)[0] if "-" in v else v


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))
