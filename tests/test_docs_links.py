"""Every place that sends a reader to the docs still lands: a citation ``docs/X.md "Section"`` (or ``README
"Section"``) in the code, the templates, the deployment files and the docs names a file that exists and a section
it has (a heading, or a bold run-in label such as ``- **Failures**:``, that starts with the cited words), and every
relative Markdown link names a file that exists and, with ``#anchor``, one of its headings."""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {".git", ".venv", "var", "node_modules", "__pycache__", "build", "dist", "test-artifacts", "shared"}
SUFFIXES = {".py", ".md", ".html", ".js", ".yaml", ".yml", ".toml", ".sh", ".example", ".txt"}
# docs/X.md "Section", docs/X.md, "Section", README's "Section", docs/X.md ("Section"; quotes escaped in Python strings
CITATION = re.compile(r'(README(?:\.md)?|docs/[\w./-]+\.md)(?:\'s)?,?\s*\(?\\?"([^"\\(){}=,]{2,90})\\?"')
LINK = re.compile(r"\]\(([^)\s]*?)(#[\w-]+)?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*)$")
RUN_IN = re.compile(r"^\s*(?:[-*]\s+)?\*\*([^*]+)\*\*")


def sources() -> list[Path]:
    """The files a reader or a maintainer reads, this one left out (its examples cite nothing)."""
    out = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            path = Path(folder) / name
            if path.suffix in SUFFIXES or name.startswith("Dockerfile") or name == "Makefile":
                out.append(path)
    return [path for path in out if path != Path(__file__).resolve()]


def _plain(text: str) -> str:
    """A title as compared: line breaks (and a Python or YAML comment's leading '#') joined, no markup, lower case."""
    text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)
    return re.sub(r"[`*]", "", text).strip().rstrip(".:").strip().lower()


def _slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


@cache
def sections(doc: Path) -> tuple[list[str], list[str]]:
    """(headings, run-in labels) of a Markdown file, fenced code left out."""
    headings, labels, fenced = [], [], False
    for line in doc.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if m := HEADING.match(line):
            headings.append(m[1])
        elif m := RUN_IN.match(line):
            labels.append(m[1])
    return headings, labels


def broken_citations(path: Path, text: str) -> list[str]:
    out = []
    for m in CITATION.finditer(text):
        name, cited = m[1], _plain(m[2])
        doc = ROOT / ("README.md" if name.startswith("README") else name)
        where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
        if not doc.is_file():
            out.append(f"{where}: {name} does not exist")
            continue
        headings, labels = sections(doc)
        if not any(_plain(title).startswith(cited) for title in headings + labels):
            out.append(f'{where}: {name} has no section "{m[2]}"')
    return out


def broken_links(path: Path, text: str) -> list[str]:
    out = []
    for m in LINK.finditer(text):
        target, anchor = m[1], m[2]
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
        linked = (path.parent / target).resolve() if target else path
        if not linked.exists():
            out.append(f"{where}: {target} does not exist")
        elif anchor and linked.suffix == ".md" and anchor[1:] not in {_slug(h) for h in sections(linked)[0]}:
            out.append(f"{where}: {target or path.name} has no heading for {anchor}")
    return out


def test_every_docs_citation_names_a_section_that_exists():
    broken = [b for path in sources() for b in broken_citations(path, path.read_text(errors="replace"))]
    assert not broken, "citations that lead nowhere:\n" + "\n".join(broken)


def test_every_markdown_link_resolves():
    broken = [b for path in sources() if path.suffix == ".md" for b in broken_links(path, path.read_text())]
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


def test_the_checker_catches_a_missing_section_and_a_missing_anchor():
    readme = ROOT / "README.md"
    assert broken_citations(readme, 'see docs/glossary.md "No such section here"')
    assert not broken_citations(readme, 'see docs/glossary.md "Broadcast"')
    assert broken_links(readme, "[x](docs/glossary.md#no-such-heading)")
    assert not broken_links(readme, "[x](docs/glossary.md#broadcast)")
    assert broken_links(readme, "[x](docs/no-such-page.md)")
