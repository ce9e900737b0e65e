"""Pure parsers for os-release / lsb-release text, and the host facts we act on."""

from __future__ import annotations

import re
from dataclasses import asdict

from installer.base.dataclass import dataclass
from installer.base.errors import UnsupportedHostError


def parse_env_file(text: str) -> dict[str, str]:
    """Parse shell-style ``KEY=value`` lines (os-release(5), lsb-release, .cache).

    Quotes and backslash escapes are handled as a shell would; comments, blank
    and malformed lines are ignored rather than fatal, as systemd does.
    """
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.strip()
        if not key.replace("_", "").isalnum():
            continue
        words = shell_words(value)
        if words is not None:
            values[key] = " ".join(words)
    return values


def shell_words(text: str) -> list[str] | None:
    """``text`` split into words as ``shlex.split`` (POSIX mode) does; None when a quote or
    an escape is left open.

    One regular-expression pass with no backtracking: ``shlex`` is quadratic on
    long values, and these files come from the host (a 40 MB PRETTY_NAME must
    not stall the run).
    """
    words: list[str] = []
    word: list[str] = []
    in_word = False
    pos, n = 0, len(text)
    while pos < n:
        m = _SHELL_TOKEN.match(text, pos)
        if m is None:
            return None
        pos = m.end()
        blank, single, double, escaped, plain = m.groups()
        if blank is not None:
            if in_word:
                words.append("".join(word))
                word, in_word = [], False
            continue
        in_word = True
        if double is not None:
            word.append(_DQ_ESCAPE.sub(r"\1", double))
        else:
            word.append(next(g for g in (single, escaped, plain) if g is not None))
    if in_word:
        words.append("".join(word))
    return words


# Blanks | 'single' | "double" | \x | plain run; possessive: linear even when a quote is open.
_SHELL_TOKEN = re.compile(
    r"""([ \t\r\n]++)|'([^']*+)'|"((?:[^"\\]++|\\.)*+)"|\\(.)|([^ \t\r\n'"\\]++)""", re.S)
_DQ_ESCAPE = re.compile(r'\\(["\\])')


UNKNOWN_DISTRO = "unknown"


@dataclass(frozen=True)
class HostInfo:
    os_id: str  # "cos", "ubuntu", "debian"
    distro: str  # the name of the distro class that recognised it: "cos", "ubuntu", "debian"
    version_id: str
    pretty_name: str
    kernel_release: str
    build_id: str | None = None  # COS only
    board: str | None = None  # COS only (from lsb-release)

    def to_dict(self) -> dict[str, str | None]:
        return asdict(self)

    @classmethod
    def unknown(cls, kernel_release: str) -> HostInfo:
        """A host whose OS cannot be told (doctor and uninstall still work there)."""
        return cls(UNKNOWN_DISTRO, UNKNOWN_DISTRO, "", UNKNOWN_DISTRO, kernel_release)

    @property
    def known(self) -> bool:
        return self.distro != UNKNOWN_DISTRO


def os_release_fields(os_release: str | None, os_release_path: str) -> dict[str, str]:
    """The os-release fields of a host, which must name its OS (ID=)."""
    if os_release is None:
        raise UnsupportedHostError(
            f"cannot read {os_release_path} on the host",
            hint="check --host-root (ROOT_MOUNT_DIR) points at the host's root filesystem",
            path=os_release_path,
        )
    fields = parse_env_file(os_release)
    os_id = fields.get("ID", "").lower()
    if not os_id:
        raise UnsupportedHostError(
            f"{os_release_path} has no ID field",
            hint="point --host-root (ROOT_MOUNT_DIR) at the node's root filesystem, whose "
            "/etc/os-release names the OS in an ID= line (e.g. ID=cos or ID=ubuntu)",
            path=os_release_path,
        )
    return fields
