"""``bench/compare_revisions.py``: the same benchmark on two revisions, side by side."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from compare_revisions import flatten  # noqa: E402


def test_numeric_leaves_are_named_by_path_and_by_the_labels_of_list_items() -> None:
    data = {
        "durationS": 4,
        "ok": True,
        "groups": [{"class": "batch", "caller": "bulk", "runsPerMinute": 40.5, "ttftP50": None}],
        "runs": [[1, 2]],
    }
    assert flatten(data) == {
        "durationS": 4.0,
        "groups.batch/bulk.runsPerMinute": 40.5,
        "runs.0.0": 1.0,
        "runs.0.1": 2.0,
    }


def test_two_revisions_run_the_same_script_and_print_ratios(tmp_path: Path) -> None:
    # The script reports which checkout it imported luftpause from: each revision's own.
    script = tmp_path / "where.py"
    script.write_text(
        "import json, sys, luftpause\n"
        "out = sys.argv[sys.argv.index('--json') + 1]\n"
        "mine = int('luftpause-compare-' in luftpause.__file__)\n"
        "json.dump({'fromCheckout': mine, 'same': 7}, open(out, 'w'))\n"
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compare_revisions.py"), "HEAD", "HEAD", "--", str(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "LUFTPAUSE_NO_EXTENSIONS": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["figure", "HEAD", "HEAD", "B/A"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert rows["same"] == ["7", "7", "1.00"]
    assert rows["fromCheckout"] == ["1", "1", "1.00"]  # each run imported its checkout's luftpause
    assert (
        "luftpause-compare-"
        not in subprocess.run(
            ["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    )  # the checkouts are removed
