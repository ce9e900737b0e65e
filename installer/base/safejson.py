"""The one parser for JSON we did not write ourselves in this run: bundle indexes and
manifests from the network, records left on the host (``status.json``, tool markers).

``json.loads`` recurses once per nesting level: ``"[" * 100000`` is a RecursionError (an
exit 1 with a traceback), and a document just under the recursion limit still makes
every later recursive walk of it (``scrub``, ``json.dumps``) a hazard. So the size is
capped and the nesting depth is counted, without recursion, before parsing.
"""

from __future__ import annotations

import json
import operator
import re
from itertools import accumulate, count, repeat
from typing import Any

# Our deepest record (a bundle index: index -> bundles -> entry) nests 3 levels.
MAX_DEPTH = 64

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # brackets inside strings do not count
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPENS = bytes.maketrans(b"[{]}", b"\x01\x01\x00\x00")


class BadJSON(ValueError):
    """Not JSON we accept; a ValueError, as json.JSONDecodeError is."""


def depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in ``raw`` (not validated: the parser does).

    Counted by C-level iterators: ~0.5 s for a 16 MB index of a million brackets,
    where a Python loop over them takes seconds."""
    opens = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS).translate(_OPENS)
    # After the i-th bracket the depth is opens - closes = 2 * opens so far - i.
    return max(map(operator.sub, map(operator.mul, accumulate(opens), repeat(2)), count(1)),
               default=0)


def loads(data: str | bytes, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """Parse untrusted JSON of at most ``max_bytes`` nested at most ``max_depth`` deep.

    Raises BadJSON (a ValueError) whose message completes "<the document> ...": never
    RecursionError."""
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    if len(raw) > max_bytes:
        raise BadJSON(f"is larger than {max_bytes} bytes")
    if depth(raw) > max_depth:
        raise BadJSON(f"is nested more than {max_depth} levels deep")
    try:
        return json.loads(raw)
    except RecursionError:  # cannot happen after the depth check; never a traceback
        raise BadJSON("is nested too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError too
        raise BadJSON(f"is not valid JSON: {exc}") from None
