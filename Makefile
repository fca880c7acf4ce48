# Two entry points, each creating .venv and installing what it needs on first use:
#   make demo   simulate the main job (sim run --gpus 8 --scheme p3) on built-in defaults
#   make test   lint and run the whole test suite (installs torch==2.13.0 for real runs, and
#               mlc-chakra for the Chakra trace tests)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SIM_STAMP  := $(VENV)/.installed-sim
TEST_STAMP := $(VENV)/.installed-test

.PHONY: demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(SIM_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

# torch first and pinned: an unpinned torch pulls gigabytes of CUDA packages.
$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[real,dist,dev,chakra]"
	touch $@ $(SIM_STAMP)

demo: $(SIM_STAMP)
	$(BIN)/sim run --gpus 8 --scheme p3

test: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q

bench: $(SIM_STAMP)
	$(BIN)/python bench/bench_run.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .hypothesis
