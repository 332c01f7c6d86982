# Two commands set everything up on a fresh machine: `make serve` and `make test`.
# `make venv` builds .venv for the CPU: the torch pair SGLang 0.5.23 pins, sglang --no-deps plus its
# non-CUDA dependencies (requirements/cpu.txt), and this package in editable mode.
# GPU users install instead with: pip install "domino-sglang[gpu]"

PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.domino-sglang-installed
PORT    ?= 30000
PYTEST_ARGS ?=

.PHONY: venv target serve serve-ar test test-fast lint bench clean

$(STAMP): pyproject.toml requirements/cpu.txt requirements/nodeps.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -q --disable-pip-version-check -r requirements/cpu.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -r requirements/nodeps.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

target: venv
	$(BIN)/domino-sglang prepare-target

serve: target
	$(BIN)/domino-sglang serve --port $(PORT)

serve-ar: target
	$(BIN)/domino-sglang serve --port $(PORT) --no-speculation

test: target
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

test-fast: target
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not server and not soak" $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .

bench: target
	$(BIN)/python benchmarks/ar_baseline.py

clean:
	rm -rf $(VENV)
