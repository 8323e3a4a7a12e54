PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install test samples bench clean

install:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[cpu,dev]'

test:
	$(BIN)/python -m pytest -q

samples:
	$(BIN)/python sample_models/build.py

bench:
	$(BIN)/python bench/bench_inspect.py

clean:
	rm -rf $(VENV) build *.egg-info
