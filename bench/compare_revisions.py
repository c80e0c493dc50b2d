"""Run one benchmark script on two git revisions and print the figures side by side with ratios.

    .venv/bin/python bench/compare_revisions.py REV_A REV_B -- bench/e2e_overhead.py --streams 1,16

The benchmark script is taken from the current tree (the same measurement for both revisions);
the code it measures is each revision's: both are checked out with ``git worktree`` into a
temporary directory, their Cython extensions built in place, and the script run with
``PYTHONPATH`` pointing at that checkout, so the processes it starts (``python -m luftpause ...``)
run that revision. The script must accept ``--json PATH`` and write its figures there as a JSON
object; every numeric leaf is shown as ``REV_A  REV_B  B/A`` under its dotted path (list items by
index, or by their ``name`` / ``arrangement`` / ``streams`` fields when they have them). The
``settings`` and ``repetitions`` subtrees are not figures (the inputs, and the single runs behind
a median) and are left out; a top-level ``"simulated": true`` from either side is carried through
and printed as a header line, so a simulated figure is never shown without the word.

Runs alternate A, B, A, B, ... ``--repeat`` times (default 3), and the median of each figure is
shown with its spread (min..max) beside it, so that drift on a shared machine does not favour one
revision and noise shows as noise. Both revisions are checked with ``git rev-parse --verify``
before anything is checked out (exit status 2 naming the bad one), and every worktree added is
removed again, whatever fails.
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
_NOT_FIGURES = ("settings", "repetitions")
"""Subtrees that hold inputs or the single runs behind a median, not figures to compare."""


def flatten(data: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a JSON value by dotted path; booleans and strings are not figures, nor
    anything under a key in :data:`_NOT_FIGURES`."""
    leaves: dict[str, float] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            if key in _NOT_FIGURES:
                continue
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


def simulated(data: Any) -> bool:
    """Whether a benchmark's JSON says its figures come from simulated engines."""
    return isinstance(data, dict) and data.get("simulated") is True


def verify(rev: str) -> str | None:
    """The commit ``rev`` names, or None when it names none (``git rev-parse --verify``)."""
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or None if done.returncode == 0 else None


def checkout(rev: str, into: Path) -> Path:
    """A detached worktree of ``rev`` with its extensions built in place; the worktree is
    registered before the build, so the caller removes it even when the build fails."""
    add = ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", "-f", str(into), rev]
    subprocess.run(add, check=True)
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=into,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return into


def run_once(tree: Path, script: list[str], out: Path) -> Any:
    """Run ``script`` with ``tree`` first on ``PYTHONPATH``; its JSON."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, *script, "--json", str(out)], cwd=tree, env=env, check=True)
    return json.loads(out.read_text())


def _spread(values: list[float] | None) -> str:
    if not values or len(values) < 2:
        return "-"
    return f"{min(values):.4g}..{max(values):.4g}"


def table(
    rev_a: str,
    rev_b: str,
    a: dict[str, list[float]],
    b: dict[str, list[float]],
    is_simulated: bool = False,
) -> str:
    """Median of each figure per revision with its spread (min..max over the runs) and B/A; a
    header line first when the figures are simulated."""
    width = max([len(k) for k in a | b] + [6])
    spread = max([len(_spread(v)) for v in (*a.values(), *b.values())] + [9])
    lines = ["SIMULATED engines: every figure below is from the simulator"] if is_simulated else []
    lines.append(
        f"{'figure':<{width}}  {rev_a[:12]:>12}  {'A min..max':>{spread}}  {rev_b[:12]:>12}  "
        f"{'B min..max':>{spread}}  {'B/A':>7}"
    )
    for key in sorted(a.keys() | b.keys()):
        va = statistics.median(a[key]) if key in a else None
        vb = statistics.median(b[key]) if key in b else None
        ratio = f"{vb / va:7.2f}" if va and vb is not None else "      -"
        show = [f"{v:12.4g}" if v is not None else f"{'-':>12}" for v in (va, vb)]
        lines.append(
            f"{key:<{width}}  {show[0]}  {_spread(a.get(key)):>{spread}}  {show[1]}  "
            f"{_spread(b.get(key)):>{spread}}  {ratio}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev_a")
    parser.add_argument("rev_b")
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs per revision (default 3)")
    given = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first "--" is the script's, options included.
    split = given.index("--") if "--" in given else len(given)
    args = parser.parse_args(given[:split])
    script = given[split + 1 :]
    if not script:
        parser.error("give the benchmark script after --")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    for rev in (args.rev_a, args.rev_b):
        if verify(rev) is None:
            print(f"compare_revisions: {rev!r} is not a commit in {ROOT}", file=sys.stderr)
            return 2
    script[0] = str((Path.cwd() / script[0]).resolve())
    figures: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}
    is_simulated = False
    with tempfile.TemporaryDirectory(prefix="luftpause-compare-") as tmp:
        trees: list[Path] = []
        try:
            for side, rev in (("a", args.rev_a), ("b", args.rev_b)):
                trees.append(Path(tmp) / side)  # before the checkout: a failed build leaves it registered
                checkout(rev, trees[-1])
            for round_ in range(args.repeat):
                for side, tree in zip(("a", "b"), trees, strict=True):
                    try:
                        data = run_once(tree, script, Path(tmp) / f"{side}-{round_}.json")
                    except subprocess.CalledProcessError as exc:
                        rev = args.rev_a if side == "a" else args.rev_b
                        print(
                            f"compare_revisions: the script failed on {rev}: exit {exc.returncode}",
                            file=sys.stderr,
                        )
                        return 1
                    is_simulated = is_simulated or simulated(data)
                    for key, value in flatten(data).items():
                        figures[side].setdefault(key, []).append(value)
        finally:
            for tree in trees:
                remove = ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)]
                subprocess.run(remove, check=False, capture_output=True)
            subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)
    print(table(args.rev_a, args.rev_b, figures["a"], figures["b"], is_simulated))
    return 0


if __name__ == "__main__":
    sys.exit(main())
