# gelu-serve: `make run` serves, `make test` tests; both set everything up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
REPOSITORY ?= model_repository
HOST ?= 127.0.0.1
PORT ?= 8000

# pip byte-compiles every file it installs: 100 s of a fresh install's 187, for 20,550 files of
# which importing the whole stack needs 2,768. Installs skip it and Python writes the cache of
# what is imported, on first import, even where the environment says not to.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install tools models paper accuracy accuracy-exhaustive run serve test test-fast lint format typecheck pytest pytest-split pytest-split-b pytest-rest pytest-rest-b bench bench-peers bench-pool bench-ab loadtest protos settings-doc workbench clean

# Installs by job, into $(VENV): serving and training (`make run`), the benchmark, and
# everything (`make test`: its tests cover every extra; `make install`, for developers). Each is
# installed once, a stamp per job, and again when pyproject.toml changes. The installer is uv
# (pinned), given what this machine's pip is configured with (workbench/uv.py): where pip's
# find-links names a local torch wheel, uv takes it too, and torch==2.13.0 comes from the
# registry only where no such directory is configured. uv is put into a venv without pip by
# python3's own pip (`pip --python`, pip 22.3 or later), else by the venv's. An install tries
# uv's cache alone first (--offline), then the indexes. Nothing is byte-compiled ahead: Python
# writes the cache of what is imported, on first import.
UV_VERSION := 0.13.8
EXTRAS_run := cpu,train
EXTRAS_bench := cpu,train,bench,dev
EXTRAS_all := cpu,train,dev,bench,ray,signing
UV := $(VENV)/.uv-$(UV_VERSION)
UV_PIP := $(BIN)/python -m workbench.uv pip install --quiet --python $(BIN)/python
RUN_ENV := $(VENV)/.installed-run
BENCH_ENV := $(VENV)/.installed-bench
ALL_ENV := $(VENV)/.installed-all

install: $(ALL_ENV)

$(UV):
	$(PYTHON) -m venv --without-pip $(VENV)
	$(PYTHON) -m pip --python $(BIN)/python install --quiet uv==$(UV_VERSION) \
		|| { $(BIN)/python -m ensurepip --default-pip \
		&& $(BIN)/python -m pip install --quiet uv==$(UV_VERSION); }
	touch $@

$(VENV)/.installed-%: pyproject.toml workbench/uv.py | $(UV)
	$(UV_PIP) --offline -e '.[$(EXTRAS_$*)]' 2>/dev/null || $(UV_PIP) -e '.[$(EXTRAS_$*)]'
	touch $@

# wrk (Debian) drives the benchmark and its smoke test in `make test`; valgrind counts the
# benchmark's instructions per request (bench/instructions.py); promtool (Debian's prometheus)
# runs the recording rules' unit tests (tests/deploy/test_prometheus_rules.py).
tools:
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk >/dev/null)
	@command -v valgrind >/dev/null || (apt-get update -qq && apt-get install -y -qq valgrind >/dev/null)
	@command -v promtool >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null)

models: $(RUN_ENV)
	$(BIN)/gelu-serve models --repository $(REPOSITORY)

# While the models build, the server's modules are imported once at the lowest priority, on the
# core the build leaves idle, so that the server finds their bytecode (a fresh venv has none).
run: $(RUN_ENV)
	nice -n 19 $(BIN)/python -c 'import service.host' >/dev/null 2>&1 &
	$(MAKE) --no-print-directory models serve

# The GELU paper's comparisons on Fashion-MNIST (Debian's dataset-fashion-mnist, installed here
# when missing): about 15 minutes on 2 cores; PAPER_FLAGS=--full for the paper's 50 epochs.
paper: $(BENCH_ENV) fashion-mnist
	$(BIN)/gelu-serve paper --out docs/paper $(PAPER_FLAGS)

# The activation kernels against a 50-digit reference: docs/accuracy.{md,png}.
accuracy: $(BENCH_ENV)
	$(BIN)/python -m bench.accuracy --out docs

# Every float32 input through every activation kernel, correctly rounded reference:
# docs/accuracy-exhaustive.{md,json}, quoted in docs/accuracy.md. About an hour on 2 cores, run
# niced; checkpoints in .exhaustive/, so a stopped run resumes where it stopped.
accuracy-exhaustive: $(BENCH_ENV)
	nice -n 19 $(BIN)/python -m bench.exhaustive --out docs \
		$(if $(wildcard $(REPOSITORY)/*/1/model.onnx),--repository $(REPOSITORY))

fashion-mnist:
	@test -d /usr/share/datasets/fashion-mnist || (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null) || true

serve: $(RUN_ENV)
	GELU_MODEL_REPOSITORY=$(REPOSITORY) $(BIN)/gelu-serve serve --host $(HOST) --port $(PORT)

# The gRPC face's Python modules, from service/grpc/inference.proto, and Triton's config messages,
# from contract/triton/model_config.proto (shipped; tests check them).
protos: $(ALL_ENV)
	$(BIN)/python -m service.grpc.generate
	$(BIN)/python -m contract.triton.generate

lint: $(ALL_ENV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(ALL_ENV)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: $(ALL_ENV)
	$(BIN)/mypy .

# The suite as four pytest processes at once (PYTEST_JOBS=1: one after the other): the tests of
# the service, its contract and security as a serving install runs them, torch and models/
# unimportable (tests/serving_install.py, a plugin: `python -m` puts the checkout on sys.path
# before pytest loads it), and all the others; each side in two, PYTEST_SPLIT_B and PYTEST_REST_B
# apart from the rest of it (both empty: two processes). Most tests wait on servers and
# subprocesses, so four share two cores. Each collects and runs its part in order as one process
# would; pytest-xdist's workers need identical collections and run tests in other orders, and
# this suite holds to neither yet (docs/workbench.md).
PYTEST_SPLIT ?= tests/service tests/contract tests/security
PYTEST_SPLIT_B ?= tests/service/rest tests/service/grpc tests/service/repository
PYTEST_REST_B ?= tests/bench tests/models tests/workbench
PYTEST_JOBS ?= 4
PYTEST_PARTS := pytest-split pytest-rest $(if $(strip $(PYTEST_SPLIT_B)),pytest-split-b) \
	$(if $(strip $(PYTEST_REST_B)),pytest-rest-b)

pytest: $(ALL_ENV) tools
	$(MAKE) --no-print-directory -k -j$(PYTEST_JOBS) --output-sync=target $(PYTEST_PARTS)

pytest-split: $(ALL_ENV) tools
	$(BIN)/python -m pytest -q -p tests.serving_install $(addprefix --ignore=,$(PYTEST_SPLIT_B)) \
		$(filter-out $(PYTEST_SPLIT_B),$(PYTEST_SPLIT))

pytest-split-b: $(ALL_ENV) tools
	$(BIN)/python -m pytest -q -p tests.serving_install $(PYTEST_SPLIT_B)

pytest-rest: $(ALL_ENV) tools
	$(BIN)/pytest -q $(addprefix --ignore=,$(PYTEST_SPLIT) $(PYTEST_REST_B))

pytest-rest-b: $(ALL_ENV) tools
	$(BIN)/pytest -q $(PYTEST_REST_B)

# Lint and the type check beside the pytest parts, not a minute before them (-k: every part
# runs to its end, each failure is printed whole, and make exits non-zero).
TEST_JOBS ?= 6

test: $(ALL_ENV) tools
	$(MAKE) --no-print-directory -k -j$(TEST_JOBS) --output-sync=target lint typecheck $(PYTEST_PARTS)

# The tests without real servers, full-size training, Docker or benchmarks: well under a minute.
test-fast: $(ALL_ENV)
	$(BIN)/pytest -q -m "not slow"

# The benchmark: wrk against real servers, written to docs/benchmarks.{md,json,png}. The larger
# model needs Fashion-MNIST (Debian's dataset-fashion-mnist), installed here when missing.
bench: $(BENCH_ENV) tools fashion-mnist
	$(BIN)/gelu-serve bench --repository $(REPOSITORY) $(BENCH_FLAGS)

# The same run with MLServer and BentoML beside it, each installed once into .bench-peers/.
bench-peers:
	$(MAKE) bench BENCH_FLAGS=--peers

# Earlier runs of one serving code judged together, every pass of each (bench/pool.py): the
# runs kept at the top of runs/ (a run's docs/benchmarks.json, copied there), measuring nothing.
bench-pool: $(BENCH_ENV)
	$(BIN)/gelu-serve bench --pool runs/*.json

# The service at revision OLD against this checkout, served side by side and driven by this
# checkout's harness (bench/ab.py), into .bench-ab/runs/; AB_FLAGS="--repository DIR" for a
# repository OLD can serve.
bench-ab: $(BENCH_ENV) tools
	git worktree remove --force .bench-ab/old 2>/dev/null || rm -rf .bench-ab/old
	git worktree add --detach .bench-ab/old $(OLD)
	$(BIN)/python -m bench.ab .bench-ab/old . --out .bench-ab/runs $(AB_FLAGS)
	git worktree remove --force .bench-ab/old

# docs/settings.md's table, from service/settings.py's Settings (a test checks they agree).
settings-doc: $(RUN_ENV)
	$(BIN)/python -c "from pathlib import Path; from contract.readme import replace_block; \
	from service.settings import REFERENCE_BLOCK, reference; page = Path('docs/settings.md'); \
	page.write_text(replace_block(page.read_text(), REFERENCE_BLOCK, reference()))"

# The first hour of revision OLD (default 0cc1e33) against this checkout's HEAD, each from fresh
# clones, taking turns: `make run` warm and cold, `make test`, `.ci/run` (workbench/timing.py),
# into runs/workbench-<date>/; WORKBENCH_FLAGS="--steps run-warm" for fewer. About an hour.
workbench: $(RUN_ENV)
	$(BIN)/python -m workbench.timing --old $(or $(OLD),0cc1e33) $(WORKBENCH_FLAGS)

# A headless Locust run against a service already running on HOST:PORT (`make run`).
loadtest: $(BENCH_ENV)
	$(BIN)/locust -f bench/locustfile.py --headless --users 16 --spawn-rate 16 --run-time 30s --host http://$(HOST):$(PORT)

clean:
	rm -rf $(VENV) checkpoints .bench-peers .mypy_cache .ruff_cache .pytest_cache
