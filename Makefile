# Two commands on a fresh machine with Python 3.11+:
#   make up     create .venv if absent, install luftpause with its dev tools (.[dev]), run the stack
#               on its embedded default
#   make test   the same install, then the whole test suite
PYTHON ?= python3
VENV   ?= .venv
STAMP  := $(VENV)/.installed-stamp

.PHONY: up test install browser bench bench-e2e bench-regress bench-regress-save bench-flood bench-flood-sim bench-fanout bench-all lint clean

$(STAMP): pyproject.toml setup.py $(wildcard _speedups/*.pyx _speedups/*.pxd)
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	@# setuptools warns on every editable install ("Editable installation ... folders with the same
	@# name as your package"): harmless here (the package is the folder), silenced by its message.
	PYTHONWARNINGS='ignore:Editable installation' $(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

up: $(STAMP)
	$(VENV)/bin/luftpause up

# The scheduler page's test drives Debian's headless Chromium; install it when it is missing.
browser:
	@command -v chromium >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y -q chromium >/dev/null || \
	  { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q chromium >/dev/null; }; }

test: $(STAMP) browser
	$(VENV)/bin/python -m pytest

# Benchmarks (bench/README.md has every command and its figures). `make bench` is the pytest
# micro-benchmarks (a minute); the scripts take minutes each and load the machine: run them on a
# quiet one. BENCH_ARGS passes options, e.g. make bench-flood BENCH_ARGS="--duration-s 30".
bench: $(STAMP)
	$(VENV)/bin/python -m pytest bench --benchmark-only --ignore=bench/test_bench_e2e_ratio.py

bench-e2e: $(STAMP)
	$(VENV)/bin/python bench/e2e_overhead.py $(BENCH_ARGS)

# The latency regression suite (bench/test_bench_e2e_ratio.py): a streamed turn through the
# dataplane against direct and nginx, recorded as ratios; fails when a median ratio grew past
# REGRESS_FAIL against the saved baseline REGRESS_BASELINE (bench/baselines/). Needs nginx
# (apt-get install -y nginx-light). bench-regress-save records a new baseline there.
REGRESS_BASELINE ?= 0002
REGRESS_FAIL ?= median:35%
REGRESS_ARGS = bench/test_bench_e2e_ratio.py --benchmark-only --benchmark-storage=bench/baselines -p no:cacheprovider

bench-regress: $(STAMP)
	$(VENV)/bin/python -m pytest $(REGRESS_ARGS) --benchmark-compare=$(REGRESS_BASELINE) --benchmark-compare-fail=$(REGRESS_FAIL)

bench-regress-save: $(STAMP)
	$(VENV)/bin/python -m pytest $(REGRESS_ARGS) --benchmark-save=e2e_ratio

bench-flood: $(STAMP)
	$(VENV)/bin/python bench/flood.py $(BENCH_ARGS)

bench-flood-sim: $(STAMP)
	$(VENV)/bin/python bench/flood_sim.py $(BENCH_ARGS)

bench-fanout: $(STAMP)
	$(VENV)/bin/python bench/fanout.py $(BENCH_ARGS)

bench-all: bench bench-e2e bench-flood bench-fanout

lint: $(STAMP)
	$(VENV)/bin/ruff check luftpause tests bench

clean:
	rm -rf build *.egg-info luftpause/dataplane/_sse_c*.so luftpause/dataplane/_tool_calls_c*.so luftpause/dataplane/apis/_facts_c*.so _speedups/*.c $(STAMP)
