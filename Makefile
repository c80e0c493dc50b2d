# Two commands on a fresh machine with Python 3.11+:
#   make up     create .venv if absent, install luftpause, run the stack on its embedded default
#   make test   the same install, then the whole test suite
PYTHON ?= python3
VENV   ?= .venv
STAMP  := $(VENV)/.installed-stamp

.PHONY: up test install bench lint clean

$(STAMP): pyproject.toml setup.py $(wildcard _speedups/*.pyx)
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

up: $(STAMP)
	$(VENV)/bin/luftpause up

test: $(STAMP)
	$(VENV)/bin/python -m pytest

bench: $(STAMP)
	$(VENV)/bin/python -m pytest bench --benchmark-only

lint: $(STAMP)
	$(VENV)/bin/ruff check luftpause tests bench

clean:
	rm -rf build *.egg-info luftpause/dataplane/_sse_c*.so _speedups/*.c $(STAMP)
