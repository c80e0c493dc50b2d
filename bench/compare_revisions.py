"""Run one benchmark script on two git revisions and print the figures side by side with ratios.

    .venv/bin/python bench/compare_revisions.py REV_A REV_B -- bench/e2e_overhead.py --streams 1,16

The benchmark script is taken from the current tree (the same measurement for both revisions);
the code it measures is each revision's: both are checked out with ``git worktree`` into a
temporary directory, their Cython extensions built in place, and the script run with
``PYTHONPATH`` pointing at that checkout, so the processes it starts (``python -m luftpause ...``)
run that revision. The script must accept ``--json PATH`` and write its figures there as a JSON
object; every numeric leaf is shown as ``REV_A  REV_B  B/A`` under its dotted path (list items by
index, or by their ``name`` / ``arrangement`` / ``streams`` fields when they have them).

Runs alternate A, B, A, B, ... ``--repeat`` times, and the median of each figure is shown, so
that drift on a shared machine does not favour one revision.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_LABEL_KEYS = ("name", "arrangement", "mode", "streams", "class", "caller")


def flatten(data: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a JSON value by dotted path; booleans and strings are not figures."""
    leaves: dict[str, float] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            leaves.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(data, list):
        for index, item in enumerate(data):
            label = str(index)
            if isinstance(item, dict):
                named = [f"{item[k]}" for k in _LABEL_KEYS if isinstance(item.get(k), str | int)]
                label = "/".join(named) or label
            leaves.update(flatten(item, f"{prefix}{label}."))
    elif isinstance(data, int | float) and not isinstance(data, bool):
        leaves[prefix.rstrip(".")] = float(data)
    return leaves


def checkout(rev: str, into: Path) -> Path:
    """A detached worktree of ``rev`` with its extensions built in place."""
    add = ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", "-f", str(into), rev]
    subprocess.run(add, check=True)
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=into,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return into


def run_once(tree: Path, script: list[str], out: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, *script, "--json", str(out)], cwd=tree, env=env, check=True)
    return flatten(json.loads(out.read_text()))


def table(rev_a: str, rev_b: str, a: dict[str, list[float]], b: dict[str, list[float]]) -> str:
    width = max([len(k) for k in a | b] + [6])
    lines = [f"{'figure':<{width}}  {rev_a[:12]:>12}  {rev_b[:12]:>12}  {'B/A':>7}"]
    for key in sorted(a.keys() | b.keys()):
        va = statistics.median(a[key]) if key in a else None
        vb = statistics.median(b[key]) if key in b else None
        ratio = f"{vb / va:7.2f}" if va and vb is not None else "      -"
        show = [f"{v:12.4g}" if v is not None else f"{'-':>12}" for v in (va, vb)]
        lines.append(f"{key:<{width}}  {show[0]}  {show[1]}  {ratio}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev_a")
    parser.add_argument("rev_b")
    parser.add_argument("--repeat", type=int, default=1, help="alternating runs per revision (default 1)")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    args = parser.parse_args(argv)
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        parser.error("give the benchmark script after --")
    script[0] = str((Path.cwd() / script[0]).resolve())
    figures: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}
    with tempfile.TemporaryDirectory(prefix="luftpause-compare-") as tmp:
        trees = {
            "a": checkout(args.rev_a, Path(tmp) / "a"),
            "b": checkout(args.rev_b, Path(tmp) / "b"),
        }
        try:
            for round_ in range(args.repeat):
                for side in ("a", "b"):
                    got = run_once(trees[side], script, Path(tmp) / f"{side}-{round_}.json")
                    for key, value in got.items():
                        figures[side].setdefault(key, []).append(value)
        finally:
            for tree in trees.values():
                remove = ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)]
                subprocess.run(remove, check=False)
    print(table(args.rev_a, args.rev_b, figures["a"], figures["b"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
