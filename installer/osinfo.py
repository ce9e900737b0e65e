"""Pure parsers for os-release / lsb-release text, and the host facts we act on."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from installer.errors import UnsupportedHostError

# Debian-family hosts follow the Ubuntu flow (same packaging, same kernel layout).
_UBUNTU_FAMILY = {"ubuntu", "debian"}


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


@dataclass(frozen=True)
class HostInfo:
    os_id: str  # "cos", "ubuntu", "debian"
    family: str  # the distro class that handles it: "cos" or "ubuntu"
    version_id: str
    pretty_name: str
    kernel_release: str
    build_id: str | None = None  # COS only
    board: str | None = None  # COS only (from lsb-release)

    def to_dict(self) -> dict[str, str | None]:
        return asdict(self)


def host_info_from_text(
    os_release: str | None,
    lsb_release: str | None,
    kernel_release: str,
    *,
    os_release_path: str = "/etc/os-release",
) -> HostInfo:
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
    pretty = fields.get("PRETTY_NAME", os_id)
    version_id = fields.get("VERSION_ID", "")
    if os_id == "cos":
        build_id = fields.get("BUILD_ID", "")
        if not _looks_like_cos_build_id(build_id):
            what = "no BUILD_ID" if not build_id else f"a malformed BUILD_ID {build_id!r}"
            raise UnsupportedHostError(
                f"{os_release_path} has {what}; a COS host must name its build",
                hint="expected BUILD_ID=<major>.<minor>.<patch>, e.g. BUILD_ID=17800.66.78",
                path=os_release_path,
            )
        board = parse_env_file(lsb_release or "").get("CHROMEOS_RELEASE_BOARD") or None
        return HostInfo("cos", "cos", version_id, pretty, kernel_release, build_id, board)
    id_like = set(fields.get("ID_LIKE", "").lower().split())
    if os_id in _UBUNTU_FAMILY or id_like & _UBUNTU_FAMILY:
        return HostInfo(os_id, "ubuntu", version_id, pretty, kernel_release)
    raise UnsupportedHostError(
        f"unsupported host OS {os_id!r} ({pretty})",
        hint="supported: Container-Optimized OS (ID=cos), Ubuntu and Debian",
        path=os_release_path,
    )


def _looks_like_cos_build_id(build_id: str) -> bool:
    parts = build_id.split(".")
    return len(parts) >= 2 and all(p.isdigit() for p in parts)
