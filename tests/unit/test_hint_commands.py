"""Every command a message or hint names is one the CLI has (issue 41 §4: the fabric-manager
hint named `nvidia-driver-installer fabric-manager`; the command is `sidecar fabric-manager`).

The text is every string literal in installer/ (f-strings' literal parts included: Python
joins adjacent literals, so a hint split over lines is read whole). A command is named either
after ``nvidia-driver-installer`` or between backticks starting with a top-level command; its
words are walked down the real click tree, and its ``--options`` looked up on the command
reached."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click

from installer.cli import cli

REPO = Path(__file__).resolve().parents[2]
# After the program name: words, "a|b" alternatives, then options (up to a closing mark).
_AFTER_PROGRAM = re.compile(r"nvidia-driver-installer"
                            r"((?: (?:[a-z][a-z-]*(?:\|[a-z][a-z-]*)*|--[a-z][a-z0-9-]*))+)"
                            r"(?=[\s`),.:;]|$)")
_WORD = re.compile(r"--?[a-z][\w-]*|[a-z][\w|-]*")
_BACKTICKED = re.compile(r"`([a-z][a-z-]*(?: [a-z-][a-z0-9-]*)*)[^`]*`")


def _literals(path: Path) -> list[str]:
    texts = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            texts.append("{}".join(v.value for v in node.values
                                   if isinstance(v, ast.Constant) and isinstance(v.value, str)))
    return texts


def _resolve(words: list[str]) -> str | None:
    """Why ``words`` (after the program name) is not a command line the CLI takes; None if it is."""
    ctx = click.Context(cli)
    command: click.Command = cli
    for word in words:
        if word.startswith("--"):
            known = {o for p in command.params for o in getattr(p, "opts", [])}
            if word not in known | {"--help"}:
                return f"{command.name} has no option {word}"
        elif isinstance(command, click.Group):
            found = [command.get_command(ctx, alt) for alt in word.split("|")]
            if None in found:
                return f"{command.name} has no subcommand {word}"
            command = found[0]
        else:
            return None  # an argument of a leaf command (e.g. a path): not ours to check
    return None if not isinstance(command, click.Group) or command is not cli else "no command"


def _named_commands() -> list[tuple[str, list[str]]]:
    named = []
    top = set(cli.list_commands(click.Context(cli)))
    for path in sorted((REPO / "installer").rglob("*.py")):
        where = str(path.relative_to(REPO))
        for text in _literals(path):
            for found in _AFTER_PROGRAM.finditer(text):
                named.append((where, found.group(1).split()))
            for found in _BACKTICKED.finditer(text):
                words = found.group(0).strip("`").split()
                if words[0] in top:
                    named.append((where, [w for w in words if _WORD.fullmatch(w)]))
    return named


def test_the_scan_finds_the_hints_it_is_for():
    said = {" ".join(words) for _, words in _named_commands()}
    assert {"doctor", "bundle index", "manifests render --nvswitch"} <= said, sorted(said)
    assert any(s.startswith("sidecar fabric-manager") for s in said), sorted(said)


def test_every_command_a_message_names_exists():
    wrong = [(where, " ".join(words), why) for where, words in _named_commands()
             if (why := _resolve(words)) is not None]
    assert not wrong, wrong


def test_a_wrong_command_is_caught():
    assert _resolve(["fabric-manager"]) == "cli has no subcommand fabric-manager"
    assert _resolve(["manifests", "render", "--nvswich"]) == "render has no option --nvswich"
    assert _resolve(["sidecar", "fabric-manager", "--config"]) is None


def test_every_doc_a_message_names_exists():
    """A hint that sends the operator to a page (docs/operator/upgrade.md) names one that is
    there: the README's sections moved to docs/ in issue 41."""
    named = {(str(path.relative_to(REPO)), doc)
             for path in (REPO / "installer").rglob("*.py") for text in _literals(path)
             for doc in re.findall(r"\bdocs/[\w./-]+\.md\b", text)}
    assert any(doc == "docs/operator/upgrade.md" for _, doc in named), named
    assert not [(where, doc) for where, doc in named if not (REPO / doc).is_file()]
