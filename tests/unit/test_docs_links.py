"""The documentation holds together: every relative link in README.md, docs/ and the configs'
comments names a file that exists and, with an anchor, a heading (or an explicit anchor) of
that file; docs/ stays reference-sized and names no commit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "analysis" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+?)\)")
CONF_LINK = re.compile(r"(docs/[\w.-]+\.md)#([\w-]+)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = page.read_text()
    found = {slug(h) for h in re.findall(r"^#{1,6} +(.+?) *$", text, re.M)}
    return found | set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))


def targets():
    for page in PAGES:
        for link in LINK.findall(page.read_text()):
            if not re.match(r"[a-z]+:", link):
                yield page, link


def broken(page: Path, link: str) -> str | None:
    path, _, anchor = link.partition("#")
    target = (page.parent / path).resolve() if path else page
    if not target.exists():
        return f"{page.relative_to(ROOT)}: {link} (no such file)"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"{page.relative_to(ROOT)}: {link} (no such heading)"
    return None


def test_every_relative_link_resolves():
    bad = [b for page, link in targets() if (b := broken(page, link))]
    assert not bad, "\n".join(bad)


def test_the_configs_links_into_docs_resolve():
    bad = []
    for yaml in sorted((ROOT / "conf").rglob("*.yaml")):
        for path, anchor in CONF_LINK.findall(yaml.read_text()):
            if anchor not in anchors(ROOT / path):
                bad.append(f"{yaml.relative_to(ROOT)}: {path}#{anchor}")
    assert not bad, "\n".join(bad)


def test_docs_are_reference_sized_and_name_no_commit():
    docs = sorted((ROOT / "docs").glob("*.md"))
    assert sum(p.stat().st_size for p in docs) <= 160_000
    hashes = [
        (p.name, w)
        for p in docs
        for w in re.findall(r"\b[0-9a-f]{7,40}\b", p.read_text())
        if re.search(r"[a-f]", w) and re.search(r"\d", w)
    ]
    assert len(hashes) <= 5, hashes


@pytest.mark.parametrize(
    "heading, anchor",
    [
        ("Fig. 5 at the paper's training length (`make reproduce-paper-length`)",
         "fig-5-at-the-papers-training-length-make-reproduce-paper-length"),
        ("A sweep of `run.py`", "a-sweep-of-runpy"),
        ("Fig. 5 at scale: P = 4, 16 and 32", "fig-5-at-scale-p--4-16-and-32"),
    ],
)  # fmt: skip
def test_slug_is_githubs(heading, anchor):
    assert slug(heading) == anchor


def test_every_result_file_is_named_in_a_document():
    """Each committed artifact under analysis/results/ (run archives aside) is named in
    docs/ or the README: by its file name, or by its folder when docs/results.md lists the
    folder."""
    text = "\n".join(p.read_text() for p in PAGES)
    results = ROOT / "analysis" / "results"
    unnamed = [
        str(f.relative_to(results))
        for f in sorted(results.rglob("*"))
        if f.is_file()
        and "runs" not in f.relative_to(results).parts
        and f.name not in text
        and f"{f.parent.relative_to(results)}/" not in text
    ]
    assert not unnamed, unnamed
