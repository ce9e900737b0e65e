"""installer.jail.visible and harvest.read_tail: what the jail printed or named, shown bounded
and on one line (issue 39 J5, H1)."""

from __future__ import annotations

from installer.jail import harvest
from installer.jail.visible import visible


def test_control_characters_become_visible_escapes():
    name = 'nvidia-x\n{"event": "install_ok"}\r\t\x1b[2J\x07\u2028\x85 é ok'
    shown = visible(name)
    assert shown == 'nvidia-x\\n{"event": "install_ok"}\\r\\t\\x1b[2J\\x07\\u2028\\x85 é ok'
    assert shown.isprintable() and visible(shown) == shown  # once is enough, twice the same


def test_a_tail_is_the_last_bytes_without_the_cut_line(tmp_path):
    log = tmp_path / "output.log"
    log.write_text("".join(f"line {n}\n" for n in range(100_000)))
    text = harvest.read_tail(log, 1000)
    assert len(text) <= 1000 and text.endswith("line 99999\n")
    assert text.splitlines()[0].startswith("line ") and len(text.splitlines()[0]) == 10
    assert harvest.read_tail(tmp_path / "absent") == ""


def test_harvested_modes_are_chosen_not_kept():
    assert [oct(harvest.chosen_mode(m)) for m in (0o4755, 0o6777, 0o666, 0o600, 0o1711)] == [
        "0o755", "0o755", "0o644", "0o644", "0o755"]
