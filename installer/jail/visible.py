"""Text that came from NVIDIA's code or the jail, made safe to show on one line.

A file name the jail chose, an ERROR line of nvidia-installer's log or a line of a probe's
output can hold newlines and terminal escapes: put raw into a message, a log line,
``status.json`` or ``status`` output, it forges lines of its own (a fake ``install_ok``
event) or rewrites the operator's terminal. Every such boundary passes it through
``visible`` (docs/jail.md, "Output, names and modes").
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """``text`` with every control, format and line/paragraph-separator character (all
    that str.isprintable refuses but a plain space) written as a visible escape
    (``\\n``, ``\\x1b``, ``\\u2028``): one line, nothing a terminal acts on. Safe to apply
    twice (a backslash is kept as it is)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else _escape(c) for c in text)
