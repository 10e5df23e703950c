# One-command set-up: every target creates .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck pytest diagrams check-deep clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(STAMP_RUN)

demo: $(STAMP_RUN)
	$(BIN)/turnstile log validate specs/examples/*.jsonl || true

lint: $(STAMP_DEV)
	$(BIN)/python -m ruff check .

typecheck: $(STAMP_DEV)
	$(BIN)/python -m mypy --strict machine model

pytest: $(STAMP_DEV)
	$(BIN)/python -m pytest

test: lint typecheck pytest

check-deep: $(STAMP_DEV)
	TURNSTILE_PROFILE=deep $(BIN)/python -m pytest

diagrams: $(STAMP_DEV)
	$(BIN)/turnstile diagrams --write specs/machines
	for f in specs/machines/*.dot; do dot -Tsvg $$f -o $${f%.dot}.svg; done

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
