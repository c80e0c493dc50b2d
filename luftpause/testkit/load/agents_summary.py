"""The ``luftpause loadgen --agents`` summary: per class and caller group, from the agents' runs.

The shape (``--json``) is in :mod:`luftpause.testkit.commands.loadgen`'s docstring; times are seconds.
"""

from __future__ import annotations

import io
import math
from typing import Any

from luftpause.extras import MissingExtra
from luftpause.testkit.load.agents import AgentGroup, RunOutcome

MAX_ERRORS_SHOWN = 5
"""Distinct error texts a summary keeps."""


def percentile(sorted_values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile of already sorted values; ``None`` for none."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return round(sorted_values[rank - 1], 3)


def summarize_agents(
    groups: list[AgentGroup], outcomes: list[RunOutcome], duration_s: float
) -> dict[str, Any]:
    """The ``--agents`` summary (shape in the module docstring) of ``outcomes`` over ``duration_s``."""
    rows = []
    errors: list[str] = []
    for index, spec in enumerate(groups):
        mine = [o for o in outcomes if o.group == index]
        ended = [o for o in mine if o.state != "unfinished"]
        completed = [o for o in mine if o.state == "completed"]
        run_times = sorted(o.seconds for o in completed)
        ttfts = sorted(t for o in mine for t in o.ttfts)
        prompt_tokens = sum(o.prompt_tokens for o in mine)
        cached = sum(o.cached_tokens for o in mine)
        for o in mine:
            if o.error and o.error not in errors and len(errors) < MAX_ERRORS_SHOWN:
                errors.append(o.error)
        rows.append(
            {
                "agents": spec.agents,
                "class": spec.service_class,
                "caller": spec.caller,
                "completed": len(completed),
                "failed": len(ended) - len(completed),
                "unfinished": len(mine) - len(ended),
                "runsPerMinute": round(len(completed) * 60.0 / duration_s, 2) if duration_s > 0 else None,
                "turns": sum(o.turns for o in mine),
                "toolRounds": sum(o.tool_rounds for o in mine),
                "toolCalls": sum(o.tool_calls for o in mine),
                "unforced": sum(o.unforced for o in mine),
                "promptTokens": prompt_tokens,
                "cacheHitRate": round(cached / prompt_tokens, 4) if prompt_tokens else None,
                "runTimeP50": percentile(run_times, 50),
                "runTimeP99": percentile(run_times, 99),
                "ttftP50": percentile(ttfts, 50),
                "ttftP99": percentile(ttfts, 99),
            }
        )
    return {"durationS": duration_s, "groups": rows, "errors": errors}


def render_agents(data: dict[str, Any]) -> str:
    """The ``--agents`` summary as a table, one row per group (drawn with ``rich``: raises
    :class:`~luftpause.extras.MissingExtra` without the ``tui`` extra)."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError as exc:
        raise MissingExtra("tui", "its summary table", exc) from None
    table = Table(title=f"luftpause loadgen: {data['durationS']:g} s closed loop")
    for column in (
        "class",
        "caller",
        "agents",
        "runs/min",
        "completed",
        "failed",
        "unfinished",
        "run p50",
        "run p99",
        "TTFT p50",
        "TTFT p99",
        "cache hits",
    ):
        table.add_column(column, justify="left" if column in ("class", "caller") else "right")

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f} s"

    for row in data["groups"]:
        table.add_row(
            row["class"],
            row["caller"] or "(anonymous)",
            str(row["agents"]),
            f"{row['runsPerMinute']}",
            str(row["completed"]),
            str(row["failed"]),
            str(row["unfinished"]),
            secs(row["runTimeP50"]),
            secs(row["runTimeP99"]),
            secs(row["ttftP50"]),
            secs(row["ttftP99"]),
            "-" if row["cacheHitRate"] is None else f"{row['cacheHitRate']:.0%}",
        )
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(table)
    for text in data["errors"]:
        console.print(f"error: {text}", markup=False, highlight=False)
    return console.export_text().rstrip("\n")
