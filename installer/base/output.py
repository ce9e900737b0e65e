"""How commands print their result: readable text by default, ``-o json`` for tools
(kubectl's convention). The JSON shapes are the contract; the text is for people."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from typing import IO, Any

FORMATS = ("text", "json")


def render(doc: Any, output: str, text: Callable[[Any], str] | None = None) -> str:
    if output == "json":
        return json.dumps(doc, indent=2) + "\n"
    return (text or as_text)(doc)


def as_text(doc: Any) -> str:
    """``key: value`` lines, nested blocks indented, list items as ``- ``."""
    return "\n".join(_lines(doc, 0)) + "\n"


def _scalar(value: Any) -> str:
    return "-" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _lines(doc: Any, depth: int) -> list[str]:
    pad = "  " * depth
    if isinstance(doc, dict):
        out = []
        for key, value in doc.items():
            if isinstance(value, dict | list) and value:
                out += [f"{pad}{key}:", *_lines(value, depth + 1)]
            else:
                out.append(f"{pad}{key}: {_scalar(value) if value not in ({}, []) else '-'}")
        return out
    if isinstance(doc, list):
        out = []
        for item in doc:
            inner = _lines(item, depth + 1)
            out.append(f"{pad}- {inner[0].lstrip()}")
            out += inner[1:]
        return out or [f"{pad}(none)"]
    return [pad + _scalar(doc)]


def plan_text(doc: dict[str, Any]) -> str:
    """``install --dry-run``: what would be installed, then the steps as a numbered list."""
    host = doc.get("host") or {}
    checks = ("pre-flight checks passed but NO NVIDIA GPU was found (no_gpu below)"
              if doc.get("no_gpu") else "pre-flight checks passed")
    head = (f"dry run: {doc.get('kind')} plan for {host.get('pretty_name') or host.get('os_id')}, "
            f"kernel {host.get('kernel_release')}; {checks}, nothing was changed")
    skip = {"dry_run", "host", "kind", "steps", "assumed_gpu"}
    summary = as_text({k: v for k, v in doc.items() if k not in skip}).splitlines()
    if gpu := doc.get("assumed_gpu"):  # --gpu-model: said before anything else
        head = (f"ASSUMED GPU: {gpu['name']} ({gpu['device_id']}, --gpu-model "
                f"{gpu['requested']}): this node has no NVIDIA GPU; the plan is for one "
                "with that GPU on its PCI bus (the NVLink fabric is still this node's)\n"
                + head)
    steps = []
    for i, s in enumerate(doc.get("steps") or [], 1):
        line = f"  {i:2}. {s['name']}: {s['detail']}" if s.get("detail") else f"  {i:2}. {s['name']}"
        steps.append(line + (" [checked: passed]" if s.get("check") else ""))
    return "\n".join([head, *summary, "steps:", *steps]) + "\n"


class GuardedStream(io.TextIOBase):
    """stdout or stderr whose writes never raise: a closed pipe (``install 2>&1 | head``),
    a full disk under a redirect or a vanished terminal must not change what the installer
    does to the node. The first failure points the fd at /dev/null (so the
    interpreter's last flush is quiet too), calls ``on_failure`` once, and later output is
    dropped."""

    def __init__(self, stream: IO[str], on_failure: Callable[[OSError | ValueError], None]
                 | None = None) -> None:
        super().__init__()
        self.stream = stream
        self.on_failure = on_failure
        self.failed = False

    # ignored: TextIOBase declares these as attributes; here they follow the wrapped stream
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.stream, "errors", None)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        try:
            return not self.failed and self.stream.isatty()
        except (OSError, ValueError, AttributeError):
            return False

    def fileno(self) -> int:
        return self.stream.fileno()

    def write(self, text: str) -> int:
        if not self.failed:
            self._guarded(self.stream.write, text)
        return len(text)

    def flush(self) -> None:
        if not self.failed:
            self._guarded(self.stream.flush)

    def _guarded(self, call: Callable[..., Any], *args: Any) -> None:
        try:
            call(*args)
        except (OSError, ValueError) as exc:  # EPIPE, EIO, ENOSPC; ValueError: closed file
            self.failed = True
            _silence(self.stream)
            if self.on_failure is not None:
                self.on_failure(exc)


def _silence(stream: IO[str]) -> None:
    """Point the stream's fd at /dev/null: what is still buffered in it goes nowhere, quietly."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)
