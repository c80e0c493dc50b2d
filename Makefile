# Two commands on a fresh machine with Python 3.11+:
#   make up     create .venv if absent, install luftpause with its dev tools (.[dev]), run the stack
#               on its embedded default
#   make test   the same install, then the whole test suite
PYTHON ?= python3
VENV   ?= .venv
STAMP  := $(VENV)/.installed-stamp

.PHONY: up test install lock browser postgresql bench bench-e2e bench-regress bench-regress-save bench-flood bench-flood-sim bench-fanout bench-all lint clean

LOCK   := requirements/dev.lock

# The dev install takes every version from $(LOCK) (uv's resolution of .[dev], committed), so a
# fresh clone installs what the suite last passed with; pyproject.toml keeps ranges for users of
# the package. `make lock` refreshes the pins on purpose.
$(STAMP): pyproject.toml setup.py $(LOCK) $(wildcard _speedups/*.pyx _speedups/*.pxd)
	@test -x $(VENV)/bin/python || { echo "luftpause: creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "luftpause: installing luftpause and its dev tools into $(VENV) from $(LOCK)"
	@echo "           (about 140 packages: 3-5 minutes on a fresh machine, seconds once pip's cache is warm)"
	@$(VENV)/bin/python -m pip install --quiet --upgrade pip
	@echo "luftpause: [1/2] dependencies"
	@$(VENV)/bin/python -m pip install --quiet --progress-bar off -r $(LOCK)
	@echo "luftpause: [2/2] luftpause itself (compiles the Cython hot path)"
	@# setuptools warns on every editable install ("Editable installation ... folders with the same
	@# name as your package"): harmless here (the package is the folder), silenced by its message.
	@PYTHONWARNINGS='ignore:Editable installation' $(VENV)/bin/python -m pip install --quiet -c $(LOCK) -e '.[dev]'
	@touch $(STAMP)
	@echo "luftpause: installed"

# Re-resolve the dev install's pins (needs the network); commit the result with the test run it
# passed.
lock: $(STAMP)
	$(VENV)/bin/python -m uv pip compile pyproject.toml --extra dev --universal --python-version 3.11 \
	  --custom-compile-command "make lock" -o $(LOCK) --upgrade

install: $(STAMP)

up: $(STAMP)
	$(VENV)/bin/luftpause up

# The scheduler page's test drives Debian's headless Chromium; install it when it is missing.
browser:
	@command -v chromium >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y -q chromium >/dev/null || \
	  { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q chromium >/dev/null; }; }

# The runtime's PostgreSQL store is tested against Debian's PostgreSQL, started by the tests in a
# temporary folder (tests/postgres_helpers.py); install it when it is missing.
postgresql:
	@{ command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y -q postgresql >/dev/null || \
	  { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q postgresql >/dev/null; }; }

test: $(STAMP) browser postgresql
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
# REGRESS_FAIL against the saved baseline REGRESS_BASELINE (bench/baselines/; `*/` finds it under
# whichever platform's folder saved it). A baseline saved on other hardware is compared all the
# same, the difference reported (bench/baseline_machine.py): ratios carry across machines. Needs
# nginx (apt-get install -y nginx-light). bench-regress-save records a new baseline there.
REGRESS_BASELINE ?= */0002
REGRESS_FAIL ?= median:35%
REGRESS_ARGS = bench/test_bench_e2e_ratio.py --benchmark-only --benchmark-storage=bench/baselines -p no:cacheprovider

bench-regress: $(STAMP)
	$(VENV)/bin/python -m pytest $(REGRESS_ARGS) --benchmark-compare='$(REGRESS_BASELINE)' --benchmark-compare-fail=$(REGRESS_FAIL)

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
	rm -rf build *.egg-info luftpause/dataplane/_sse_c*.so luftpause/tool_calls/_tool_calls_c*.so luftpause/dataplane/apis/_facts_c*.so _speedups/*.c $(STAMP)
