"""``bench/compare_revisions.py``: the same benchmark on two revisions, side by side."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from repo_paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))

from compare_revisions import flatten, table


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


def test_settings_and_single_repetitions_are_not_figures() -> None:
    data = {
        "simulated": True,
        "settings": {"repeat": 2, "flood": {"batch_agents": 48}},
        "flood": [{"arrangement": "luftpause", "cacheHitRate": 0.5, "repetitions": [{"cacheHitRate": 0.4}]}],
    }
    assert flatten(data) == {"flood.luftpause.cacheHitRate": 0.5}


def test_the_table_shows_the_spread_and_says_simulated() -> None:
    text = table("A", "B", {"x": [1.0, 3.0, 2.0]}, {"x": [4.0, 4.5, 5.0]}, is_simulated=True)
    header, columns, row = text.splitlines()
    assert "SIMULATED" in header
    assert columns.split() == ["figure", "A", "A", "min..max", "B", "B", "min..max", "B/A"]
    assert row.split() == ["x", "2", "1..3", "4.5", "4..5", "2.25"]
    assert "SIMULATED" not in table("A", "B", {"x": [1.0]}, {"x": [1.0]})


def _worktrees() -> str:
    done = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout


def test_a_bad_revision_is_refused_before_anything_is_checked_out(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compare_revisions.py"), "HEAD", "no-such-rev-x", "--", "x.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "'no-such-rev-x' is not a commit" in done.stderr
    assert "Traceback" not in done.stderr
    assert "luftpause-compare-" not in _worktrees()


def test_two_revisions_run_the_same_script_and_print_ratios(tmp_path: Path) -> None:
    # The script reports which checkout it imported luftpause from: each revision's own.
    script = tmp_path / "where.py"
    script.write_text(
        "import json, sys, luftpause\n"
        "out = sys.argv[sys.argv.index('--json') + 1]\n"
        "mine = int('luftpause-compare-' in luftpause.__file__)\n"
        "json.dump({'simulated': True, 'fromCheckout': mine, 'same': 7}, open(out, 'w'))\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "compare_revisions.py"),
            "HEAD",
            "HEAD",
            "--repeat",
            "2",
            "--",
            str(script),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "LUFTPAUSE_NO_EXTENSIONS": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("SIMULATED")  # the benchmark said so: the comparison says so too
    assert lines[1].split() == ["figure", "HEAD", "A", "min..max", "HEAD", "B", "min..max", "B/A"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert rows["same"] == ["7", "7..7", "7", "7..7", "1.00"]
    # Each run imported its checkout's luftpause.
    assert rows["fromCheckout"] == ["1", "1..1", "1", "1..1", "1.00"]
    assert "luftpause-compare-" not in _worktrees()  # the checkouts are removed
