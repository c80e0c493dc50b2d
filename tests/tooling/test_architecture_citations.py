"""The code cites ``docs/architecture.md`` by section, and every section it cites is there (issue 16:
the code cited ``DESIGN.md`` 31 times, a file the repository does not have).
"""

from __future__ import annotations

import re
from pathlib import Path

from repo_paths import ROOT

DOC = ROOT / "docs" / "architecture.md"
SOURCES = [
    *(ROOT / "luftpause").rglob("*.py"),
    *(ROOT / "tests").rglob("*.py"),
    *(ROOT / "bench").glob("*.py"),
    *(ROOT / "examples").glob("*.py"),
    *(ROOT / "proto").rglob("*.proto"),
    ROOT / "README.md",
    ROOT / "bench" / "README.md",
    *(ROOT / "docs").glob("*.md"),
]

# docs/architecture.md "A", "B": the titles after the path, across a line break and a comment
# marker (``#``, ``//``) when the citation is wrapped; "(docs/architecture.md, "A")" too.
CITATION = re.compile(
    r'docs/architecture\.md[,:]?\s*(?:(?:#|//)\s*)?\(?((?:"[^"\n]+"(?:,\s*(?:(?:#|//)\s*)?)?)+)'
)
TITLE = re.compile(r'"([^"\n]+)"')


def _sections() -> set[str]:
    return {line.lstrip("#").strip() for line in DOC.read_text().splitlines() if line.startswith("#")}


def test_every_cited_section_of_the_architecture_exists() -> None:
    sections = _sections()
    cited: dict[str, list[str]] = {}
    for path in SOURCES:
        if path == Path(__file__):
            continue
        for match in CITATION.finditer(path.read_text()):
            for title in TITLE.findall(match.group(1)):
                cited.setdefault(title, []).append(str(path.relative_to(ROOT)))
    missing = {title: where for title, where in cited.items() if title not in sections}
    assert missing == {}, f"cited sections docs/architecture.md lacks: {missing}"
    assert len(cited) >= 10  # the code does cite it, section by section


def test_nothing_cites_a_design_file_the_repository_does_not_have() -> None:
    design = "DESIGN" + ".md"  # not written whole: this file would cite it
    citing = [str(p.relative_to(ROOT)) for p in SOURCES if p != Path(__file__) and design in p.read_text()]
    assert citing == []
