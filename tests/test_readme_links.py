"""The README and docs/ point at each other by relative paths and heading anchors: a section moved
to docs/ or a renamed heading must not leave a link that GitHub shows as dead."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_MARKDOWN = MarkdownIt("commonmark").enable("table")


def _inline(page: Path):
    """Every inline token of the page, code blocks left out, as the page renders."""
    for token in _MARKDOWN.parse(page.read_text()):
        if token.type == "inline":
            yield token


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, no punctuation, spaces as hyphens, repeats numbered."""
    ids: set[str] = set()
    repeats: dict[str, int] = {}
    tokens = _MARKDOWN.parse(page.read_text())
    for opening, inline in itertools.pairwise(tokens):
        if opening.type != "heading_open":
            continue
        words = [c for c in inline.children or [] if c.type in ("text", "code_inline")]
        text = "".join(c.content for c in words)
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        ids.add(f"{slug}-{repeats[slug]}" if slug in repeats else slug)
        repeats[slug] = repeats.get(slug, 0) + 1
    return ids


def links(page: Path) -> list[str]:
    """The page's relative link and image targets (web addresses are not checked here)."""
    found = []
    for inline in _inline(page):
        for child in inline.children or []:
            target = child.attrs.get("href") if child.type == "link_open" else None
            target = child.attrs.get("src") if child.type == "image" else target
            if target and not urlsplit(str(target)).scheme:
                found.append(str(target))
    return found


def test_the_readme_links_to_the_docs():
    assert any(link.startswith("docs/") for link in links(ROOT / "README.md"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    dead = []
    for link in links(page):
        parts = urlsplit(link)
        target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
        if not target.exists():
            dead.append(f"{link}: no file {target.relative_to(ROOT)}")
        elif parts.fragment and target.suffix == ".md" and parts.fragment not in anchors(target):
            dead.append(f"{link}: no heading #{parts.fragment} in {target.relative_to(ROOT)}")
    assert not dead, f"{page.relative_to(ROOT)}: dead links:\n" + "\n".join(dead)
