# gelu-serve: `make run` serves, `make test` tests; both set everything up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
REPOSITORY ?= model_repository
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install models run serve test lint format typecheck pytest clean

install: $(VENV)/.installed

# Reinstall whenever pyproject.toml changes. torch==2.13.0 is taken from the local wheel
# directory where pip is configured with one; elsewhere it comes from the registry.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[cpu,train,dev]'
	touch $@

models: install
	$(BIN)/gelu-serve models --repository $(REPOSITORY)

run: models serve

serve: install
	GELU_MODEL_REPOSITORY=$(REPOSITORY) $(BIN)/gelu-serve serve --host $(HOST) --port $(PORT)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: install
	$(BIN)/mypy .

pytest: install
	$(BIN)/pytest -q

test: lint typecheck pytest

clean:
	rm -rf $(VENV) checkpoints .mypy_cache .ruff_cache .pytest_cache
