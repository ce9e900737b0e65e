"""safejson: the size and depth limits come before json.loads can recurse."""

from __future__ import annotations

import json

import pytest

from installer.base import safejson


@pytest.mark.parametrize(("doc", "deepest"), [
    (b"1", 0), (b"{}", 1), (b'{"a": [1, {"b": []}]}', 4),
    (b'["[[[[{{", "\\"]]]"]', 1),  # brackets and escaped quotes inside strings do not count
])
def test_depth(doc, deepest):
    assert safejson.depth(doc) == deepest


@pytest.mark.parametrize(("doc", "error"), [
    ("[" * 100_000, "nested more than 64 levels deep"),  # RecursionError in json.loads
    ("[" * 65 + "]" * 65, "nested more than 64 levels deep"),
    ("{not json", "is not valid JSON"),
    (b"\xff\xfe", "is not valid JSON"),
    (" " * 101, "larger than 100 bytes"),
])
def test_refused(doc, error):
    with pytest.raises(safejson.BadJSON, match=error):
        safejson.loads(doc, max_bytes=100 if error.startswith("larger") else 1 << 20)


def test_accepted_at_the_limit():
    assert safejson.loads("[" * 64 + "]" * 64, max_bytes=1 << 10) == json.loads("[" * 64 + "]" * 64)
