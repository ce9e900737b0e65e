"""Every relative link in README.md and docs/**/*.md names a file that exists, and its
#anchor a heading there (issue 41: the README was split into docs/ pages; a moved section
must not leave a dead link behind). Anchors are GitHub's: the heading lower-cased, every
character but letters, digits, spaces, '-' and '_' dropped, spaces made '-', a repeat
suffixed -1, -2, ..."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^\s*(```|~~~)")


def _prose(text: str) -> list[str]:
    """The lines outside code fences (a shell comment there is no heading, a [x](y) no link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in _prose(page.read_text()):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    found |= set(re.findall(r'<a (?:name|id)="([^"]+)"', page.read_text()))
    return found


def links(page: Path) -> list[str]:
    return [target for line in _prose(page.read_text()) for target in _LINK.findall(line)
            if not re.match(r"[a-z][a-z+.-]*:", target)]  # http:, https:, mailto: ...


def dead_links(page: Path) -> list[str]:
    dead = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            dead.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            dead.append(f"{target}: no heading #{anchor} in {dest.name}")
    return dead


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    assert not dead_links(page), dead_links(page)


def test_the_checker_catches_a_dead_file_and_a_dead_anchor(tmp_path):
    page = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# B title\n\n## Exit codes\n\n```sh\n# not a heading\n```\n")
    page.write_text("[ok](b.md#exit-codes) [gone](c.md) [bad](b.md#not-a-heading) "
                    "[web](https://example.com/x) [self](#top)\n\n# Top\n")
    assert dead_links(page) == ["c.md: no such file",
                                "b.md#not-a-heading: no heading #not-a-heading in b.md"]
    assert slug("Switching from GKE's installer") == "switching-from-gkes-installer"
    assert slug('What "ready" means') == "what-ready-means"
