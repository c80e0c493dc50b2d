"""The columns of ``luftpause top``'s tree and how wide each is at a terminal's width
(:func:`column_widths`), and the whole frame as plain text (:func:`plain_frame`, what ``--once``
prints: drawn by nothing, so ``rich`` is not needed). The live view (:mod:`luftpause.top.view`)
lays out its ``rich`` table with the same widths."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from luftpause.top.monitor_client import one_line
from luftpause.top.network import count_text, counts_line, fit, short_scope, state_word, stopped

__all__ = [
    "ANSWER_FLOOR_WIDTH",
    "ANSWER_MIN_WIDTH",
    "COLUMNS",
    "COLUMN_CAPS",
    "COLUMN_GAP",
    "OPTIONAL_COLUMNS",
    "RUN_MIN_WIDTH",
    "cell_width",
    "column_widths",
    "cut",
    "plain_frame",
]

COLUMNS = ("RUN", "HANDLE", "STATE", "CLASS", "TURNS", "TOOLS", "SCOPE", "LAST ANSWER")
OPTIONAL_COLUMNS = ("TURNS", "TOOLS", "CLASS", "SCOPE")
"""Shown while they fit whole beside a useful last answer; dropped last one first (SCOPE first)."""
COLUMN_CAPS = {"RUN": 40, "SCOPE": 40}
"""Widest a name (with its tree guide) or a scope is shown, in columns."""
COLUMN_GAP = 2
RUN_MIN_WIDTH = 12
"""Columns a name keeps before handles and states are cut (a longer name is cut with ``…``)."""
ANSWER_MIN_WIDTH = 24
"""Columns the last answer keeps before an optional column is shown."""
ANSWER_FLOOR_WIDTH = 8
"""Below this many columns the last answer is not shown at all."""


def column_widths(desired: Mapping[str, int], width: int) -> dict[str, int]:
    """The columns shown in ``width`` terminal columns and the width of each (cells; gaps of
    :data:`COLUMN_GAP` not counted), from the width each would take whole (``desired``: every
    name of :data:`COLUMNS`). RUN, HANDLE and STATE are always shown: the name narrowed first
    (to :data:`RUN_MIN_WIDTH`), handles and states cut only when even that does not fit. The last
    answer comes next, then the optional columns while they fit whole beside
    :data:`ANSWER_MIN_WIDTH` of answer; what is left widens the name, then the answer."""
    shown = {
        "RUN": min(desired["RUN"], RUN_MIN_WIDTH),
        "HANDLE": desired["HANDLE"],
        "STATE": desired["STATE"],
    }

    def used(columns: Mapping[str, int]) -> int:
        return sum(columns.values()) + COLUMN_GAP * (len(columns) - 1)

    for name in ("RUN", "STATE", "HANDLE"):  # a terminal too narrow for whole handles
        shown[name] = max(1, shown[name] - max(0, used(shown) - width))
    answer_min = min(desired["LAST ANSWER"], ANSWER_MIN_WIDTH)
    room = width - used(shown) - COLUMN_GAP
    if room >= ANSWER_FLOOR_WIDTH:
        shown["LAST ANSWER"] = min(room, answer_min)
        for name in OPTIONAL_COLUMNS:
            if used(shown) + COLUMN_GAP + desired[name] > width:
                break
            shown[name] = desired[name]
    for name in ("RUN", "LAST ANSWER"):
        if name in shown:
            shown[name] += max(0, min(desired[name] - shown[name], width - used(shown)))
    return {name: shown[name] for name in COLUMNS if name in shown}


def cell_width(text: str) -> int:
    """Terminal columns ``text`` takes: 2 for an East Asian wide or full-width character, 0 for a
    combining one, else 1 (what rich's ``cell_len`` counts for the characters a run shows)."""
    width = 0
    for char in text:
        if unicodedata.combining(char):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` columns, cut with ``…`` as rich's ``overflow="ellipsis"``."""
    if cell_width(text) <= width:
        return text
    kept, used = "", 0
    for char in text:
        step = cell_width(char)
        if used + step > width - 1:
            break
        kept += char
        used += step
    return kept + " " * (width - 1 - used) + "…"  # a wide character that did not fit: a space


def _plain_row(guide: str, run: Mapping[str, Any]) -> dict[str, str]:
    name = run.get("name") or "(unnamed)"
    answer = run.get("lastAnswer") or (f"error: {run['error']}" if run.get("error") else "")
    return {
        "RUN": guide + one_line(str(name)),
        "HANDLE": one_line(str(run.get("handle"))),
        "STATE": one_line(state_word(run)) + (" (stopped)" if stopped(run) else ""),
        "CLASS": one_line(str(run.get("serviceClass") or "-")),
        "TURNS": count_text(run.get("turns")),
        "TOOLS": count_text(run.get("toolCalls")),
        "SCOPE": one_line(short_scope(run.get("scope"))),
        "LAST ANSWER": one_line(str(answer)),
    }


def plain_frame(runs: Sequence[Mapping[str, Any]] | None, url: str, width: int) -> str:
    """What :func:`frame` shows of every run at ``width`` columns, as plain text with no style:
    the same lines, columns and cuts, no line ending in spaces. ``luftpause top --once`` prints it."""
    lines = [cut(f"luftpause top  {one_line(url)}", width), cut(one_line(counts_line(runs or ())), width)]
    if runs:
        rows = [_plain_row(guide, run) for guide, run in fit(runs, None).lines]
        desired = {
            name: min(
                COLUMN_CAPS.get(name, width), max([len(name), *(cell_width(row[name]) for row in rows)])
            )
            for name in COLUMNS
        }
        widths = column_widths(desired, width)
        for row in [{name: name for name in COLUMNS}, *rows]:
            cells = []
            for name, column_width in widths.items():
                cell = cut(row[name], column_width)
                pad = " " * (column_width - cell_width(cell))
                cells.append(pad + cell if name in ("TURNS", "TOOLS") else cell + pad)
            lines.append((" " * COLUMN_GAP).join(cells).rstrip(" "))
    return "\n".join(lines)
