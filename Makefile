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
# `make test` runs two lanes at once (tests/lanes.py: the in-process tests then some server tests,
# and the other server tests); TEST_LANES=1: one pytest process.
TEST_LANES ?= 2
HOST    ?= http://127.0.0.1:$(PORT)
USERS   ?= 4
DURATION ?= 60s

.PHONY: venv target tools serve serve-ar test test-fast lint bench loadtest clean data data-snapshot regenerate \
	train-drafter

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

# Tools for the deploy/metrics/packaging tests, each installed when missing; a tool that cannot
# be installed makes its tests skip and say why. Debian packages (when root and apt-get works):
# prometheus (prometheus + promtool), docker-compose. From PyPI into the venv: helm 3 (out of the
# aws-cdk kubectl layer wheel, deploy/tools/install_helm.py) and hatchling (offline wheel build).
DEB_TOOLS := prometheus docker-compose
tools: venv
	@{ command -v promtool && command -v docker-compose; } >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] \
	  || ! command -v apt-get >/dev/null \
	  || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(DEB_TOOLS) >/dev/null 2>&1 \
	  || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive \
	       apt-get install -y -q --no-install-recommends $(DEB_TOOLS) >/dev/null 2>&1; } \
	  || echo "warning: could not install the Debian packages $(DEB_TOOLS)"
	@command -v helm >/dev/null 2>&1 || $(BIN)/python deploy/tools/install_helm.py $(BIN) </dev/null \
	  || echo "warning: could not install helm (the Helm chart tests will skip)"
	@$(BIN)/python -c "import hatchling" 2>/dev/null || $(BIN)/pip install -q --disable-pip-version-check \
	  hatchling==1.33.0 </dev/null || echo "warning: could not install hatchling (tests/project/test_wheel.py will skip)"

test: target tools
	$(BIN)/ruff check .
ifeq ($(TEST_LANES),1)
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=20 $(PYTEST_ARGS)
else
	$(BIN)/python tests/lanes.py $(PYTEST_ARGS)
endif

test-fast: target
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not server and not soak" $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .

# The maintained speed benchmark: plain decoding vs DOMINO (served default) in one paired run.
# make bench BENCH_ARGS="--concurrency 1 2 4 8 16 32 --repeats 4"
BENCH_ARGS ?= --concurrency 1 4 --temperatures 0 --max-tokens 64 --repeats 2
bench: target
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/throughput.py --methods ar domino-adaptive \
	  $(BENCH_ARGS) --out bench

# Headless locust run against a running server (`make serve` in another shell): CSV + summary
# under benchmarks/results/loadtest/. make loadtest HOST=http://127.0.0.1:30000 USERS=8 DURATION=5m
# PROMPTS=FILE.jsonl for your own prompts; DOMINO_SGLANG_API_KEY for a server with --api-key.
PROMPTS ?=
loadtest: venv
	$(BIN)/python benchmarks/loadtest.py --host $(HOST) --users $(USERS) --duration $(DURATION) \
		$(if $(PROMPTS),--prompts $(PROMPTS))

# The shipped drafter's recipe, one file in 21 phases (~14 h on 2 CPU cores; a phase resumes where it stopped).
RECIPE     ?= domino_sglang/train/recipes/smollm2-135m.toml
REGEN_DATA ?= $(HOME)/.cache/domino_sglang/data/sharegpt-greedy256.jsonl
REGEN_SNAPSHOT := domino_sglang/train/data/sharegpt-greedy256.jsonl.gz
RUN_DIR    ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-recipe

# The regenerated answers are also kept in git (regenerate.py, "Snapshot"): `make data` restores
# them into the cache, `make data-snapshot` saves the cache's records back after a regeneration.
data: venv
	$(BIN)/domino-sglang data-snapshot restore --data $(REGEN_DATA) --snapshot $(REGEN_SNAPSHOT)

data-snapshot: venv
	$(BIN)/domino-sglang data-snapshot save --data $(REGEN_DATA) --snapshot $(REGEN_SNAPSHOT)

# The training data: every ShareGPT first turn, then every 2nd / 3rd / 4th turn that fits (ids
# 100000.., 200000.., 300000..), then the stdlib-code, math and chat templates (the phases read all).
regenerate: target data
	set -e; for a in "--limit 11137" "--turn 2 --limit 4616" "--turn 3 --limit 1432" \
	  "--turn 4 --limit 491" "--source python" "--source math" "--source chat"; do \
	  $(BIN)/domino-sglang regenerate --out $(REGEN_DATA) $$a --concurrency 64; done

# The shipped drafter from scratch: the one recipe's 21 phases in order (`--plan` lists them; a
# re-run resumes at the first unfinished phase). It is not copied into the package; compare first:
#   benchmarks/compare_drafters.py domino_sglang/drafters/SmolLM2-135M-Instruct-domino RUN_DIR/drafter
train-drafter: regenerate
	$(BIN)/domino-sglang train --config $(RECIPE) --data $(REGEN_DATA) --out $(RUN_DIR) --plan
	$(BIN)/domino-sglang train --config $(RECIPE) --data $(REGEN_DATA) --out $(RUN_DIR)

clean:
	rm -rf $(VENV)
