"""The README is a landing page and every user doc is reachable from it (issue 22: the README had
grown to 1,371 lines, with working notes of the project's own in it).

* every relative link in the README and ``docs/`` (and the benchmark and test READMEs they link
  to) names a file that is there and, with ``#anchor``, a heading of that file: sections moved
  from the README into ``docs/`` keep every link that pointed at them working;
* every page of ``docs/`` is reached from the README, following links;
* the README stays under 300 lines;
* no user doc speaks of the project's own work ("measured here", "at this stop", "Run here").
"""

from __future__ import annotations

import re
from pathlib import Path

from repo_paths import ROOT

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS, ROOT / "bench" / "README.md", ROOT / "tests" / "README.md"]

LINK = re.compile(r"\]\(([^)\s]+)\)")
WORKING_NOTES = re.compile(
    r"\b(measured|run|built|checked|seen|installed) here\b|\bhere (with|on 20|already)\b|this stop\b|"
    r"this session|on this machine\b",
    re.IGNORECASE,
)
"""Phrases of a work log, not of user docs: what was done "here", "at this stop", "this session"."""


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a Markdown text's headings (``## Three front doors: A, B`` is
    ``three-front-doors-a-b``; a repeated heading gets ``-1``, ``-2``), fenced code left out."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"^#{1,6}\s+(.*)$", line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(page: Path) -> list[tuple[Path, str]]:
    """The relative links of ``page``: (the file, the anchor or ``""``)."""
    out = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        out.append(((page.parent / path).resolve() if path else page, anchor))
    return out


def test_every_relative_link_names_a_file_and_heading_that_are_there() -> None:
    broken = []
    for page in PAGES:
        for target, anchor in links(page):
            shown = target.relative_to(ROOT) if target.is_relative_to(ROOT) else target
            where = f"{page.relative_to(ROOT)} -> {shown}"
            if not target.exists():
                broken.append(f"{where}: no such file")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target.read_text()):
                broken.append(f"{where}#{anchor}: no such heading")
    assert broken == []


def test_every_page_of_docs_is_reached_from_the_readme() -> None:
    reached = {README.resolve()}
    todo = [README]
    while todo:
        for target, _ in links(todo.pop()):
            if target.suffix == ".md" and target.exists() and target not in reached:
                reached.add(target)
                todo.append(target)
    assert [p.name for p in DOCS if p.resolve() not in reached] == []


def test_the_readme_is_a_landing_page() -> None:
    assert len(README.read_text().splitlines()) < 300


def test_no_user_doc_speaks_of_the_project_s_own_work() -> None:
    notes = [
        f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
        for page in (README, *DOCS)
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if WORKING_NOTES.search(line)
    ]
    assert notes == []


def test_the_checks_tell_working_notes_and_anchors_apart() -> None:
    assert WORKING_NOTES.search("82 s here with pip's cache warm")
    assert WORKING_NOTES.search("(re-measured at this stop: ...)")
    assert WORKING_NOTES.search('"Run here" means run against a real stack')
    assert not WORKING_NOTES.search("installed `openai` there, not in the system's Python")
    assert not WORKING_NOTES.search("answers only for this machine's host name")
    assert anchors("## Three front doors: Chat Completions, Messages, Responses\n## A\n## A") == {
        "three-front-doors-chat-completions-messages-responses",
        "a",
        "a-1",
    }
    assert anchors("### llama.cpp's server on CPU\n```\n# not a heading\n```") == {"llamacpps-server-on-cpu"}
