"""What an install costs: the distributions in a venv and the MB they take on disk.

    python tools/install_size.py VENV            # one line: "N packages, M MB (pip and setuptools left out)"
    python tools/install_size.py VENV --json     # {"packages": [...], "count": N, "mb": M}

Runs VENV's own interpreter to list its distributions (``importlib.metadata``), leaving out pip,
setuptools and wheel (what ``python -m venv`` brings, not what luftpause needs), and adds up the
sizes of the files each distribution's RECORD names (MB = 10^6 bytes). The core-install figure
of docs/install.md is this, on a fresh venv with ``pip install luftpause`` (no extras).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

_LIST = """
import json, os
from importlib.metadata import distributions
skip = {"pip", "setuptools", "wheel"}
out = []
for dist in distributions():
    name = dist.metadata["Name"]
    if name is None or name.lower() in skip:
        continue
    size = 0
    for file in dist.files or ():
        path = file.locate()
        if os.path.isfile(path):
            size += os.path.getsize(path)
    out.append({"name": name, "version": dist.version, "bytes": size})
print(json.dumps(sorted(out, key=lambda d: d["name"].lower())))
"""


def measure(venv: Path) -> dict[str, object]:
    """``{"packages": [{"name", "version", "bytes"}...], "count": int, "mb": float}`` for ``venv``.

    Raises ``FileNotFoundError`` when ``venv/bin/python`` is absent, ``CalledProcessError`` when it fails.
    """
    python = venv / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"{python}: not a venv")
    # -I: isolated, so the working directory (a checkout with its .egg-info) is not on the path
    done = subprocess.run([str(python), "-I", "-c", _LIST], capture_output=True, text=True, check=True)
    packages = json.loads(done.stdout)
    total = sum(p["bytes"] for p in packages)
    return {"packages": packages, "count": len(packages), "mb": round(total / 1e6, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("venv", type=Path)
    parser.add_argument("--json", action="store_true", help="the whole list, as JSON")
    args = parser.parse_args()
    try:
        result = measure(args.venv)
    except (FileNotFoundError, subprocess.CalledProcessError) as exc:
        print(f"install_size: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{result['count']} packages, {result['mb']} MB (pip and setuptools left out)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
