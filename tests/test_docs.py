"""The README and the pages under docs/: every relative link resolves, the README stays short, every page is reachable.

Relative links (``[text](path)``, ``[text](path#anchor)``, ``[text](#anchor)``, images too) must name an existing file,
and an anchor into a Markdown file must name one of its headings, slugged as GitHub does (lowercase, spaces to '-',
punctuation other than '-' and '_' dropped, a repeated heading gets '-1', '-2', ...). External http(s) links are not
fetched. Links inside code (fenced blocks, inline spans) are not links.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 260

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


def shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def strip_code(text: str) -> str:
    return INLINE_CODE.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    return LINK.findall(strip_code(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: Markdown markup and punctuation other than '-' and '_' dropped, lowercased,
    each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    seen: dict[str, int] = {}
    found = set(HTML_ANCHOR.findall(text))
    for heading in HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(page: Path) -> list[str]:
    """Every relative link of ``page`` that does not resolve, with the reason."""
    broken = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http(s), mailto, ...: not checked here
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no file {shown(dest)}")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            broken.append(f"{target}: no heading '#{anchor}' in {shown(dest)}")
    return broken


def test_slug_follows_github():
    assert slug("Verify on your GPU: `hf-posenc selftest`") == "verify-on-your-gpu-hf-posenc-selftest"
    assert slug("Export: stock Transformers, vLLM, llama.cpp") == "export-stock-transformers-vllm-llamacpp"
    assert slug("Is TAPA trainable?") == "is-tapa-trainable"
    assert slug("snake_case and dash-ed") == "snake_case-and-dash-ed"
    assert anchors(README) >= {"two-commands", "five-lines", "schemes"}


def test_link_checker_catches_a_broken_link(tmp_path):
    """The check can fail: a missing file, a missing heading and a missing in-page anchor are each reported."""
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md#a-section) [ok](#page) [web](https://example.com/x)\n"
                    "`[code](nowhere.md)`\n\n```\n[fenced](nowhere.md)\n```\n")
    assert broken_links(page) == []
    page.write_text("# Page\n\n[gone](missing.md) [bad anchor](other.md#no-such) [bad](#nope)\n")
    assert [b.split(":")[0] for b in broken_links(page)] == ["missing.md", "other.md#no-such", "#nope"]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    assert links(page.read_text()), f"{page.relative_to(REPO)} has no links at all: is the link pattern broken?"
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(REPO)} has broken links:\n" + "\n".join(broken)


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, (f"README.md has {n} lines (at most {README_MAX_LINES}): move the details to a "
                                   "page under docs/ and link it")


def test_readme_links_every_docs_page():
    docs = sorted(DOCS.glob("*.md"))
    assert docs, "docs/ has no pages"
    linked = {(README.parent / unquote(t.partition("#")[0])).resolve() for t in links(README.read_text())
              if t.partition("#")[0] and not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)}
    missing = [str(p.relative_to(REPO)) for p in docs if p.resolve() not in linked]
    assert not missing, f"README.md does not link these docs pages: {missing}"
