# One-command set-up: every target creates .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev
STAMP_BENCH := $(VENV)/.installed-bench

.PHONY: wheel demo test lint typecheck pytest diagrams check-deep clean mutation mutation-sample

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The distribution was called `turnstile` before it became `turnstile-agent` (the old name
# belongs to another project on the package index): an older .venv still has it installed,
# with a top-level `model` package, so it is removed first.
$(STAMP_RUN): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/python -m pip uninstall --quiet --yes turnstile 2>/dev/null || true
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(STAMP_DEV): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/python -m pip uninstall --quiet --yes turnstile 2>/dev/null || true
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(STAMP_RUN)

# A wheel to install turnstile anywhere (README, "Install"): built by pip in an isolated
# build environment from this checkout, without its dependencies.
wheel: | $(BIN)/python
	rm -rf build
	$(BIN)/python -m pip wheel --quiet --no-deps --wheel-dir dist .
	@ls dist/turnstile_agent-*.whl

# The demo: what goes wrong at an agent loop's seams and what turnstile does instead, told
# through the runtime; it ends by replaying the conformance corpus through it.
demo: $(STAMP_RUN)
	$(BIN)/turnstile demo

lint: $(STAMP_DEV)
	$(BIN)/python -m ruff check .

# model/ is checked under its folder name; installed, it is machine._model (setup.py).
# tests/, bench/, the CI scripts and setup.py are checked as strictly as the library.
typecheck: $(STAMP_DEV)
	$(BIN)/python -m mypy --strict machine model tests bench .ci/*.py setup.py

pytest: $(STAMP_DEV)
	$(BIN)/python -m pytest

test: lint typecheck pytest

check-deep: $(STAMP_DEV)
	TURNSTILE_PROFILE=deep $(BIN)/python -m pytest

diagrams: $(STAMP_DEV)
	$(BIN)/turnstile diagrams --write specs/machines
	for f in specs/machines/*.dot; do dot -Tsvg $$f -o $${f%.dot}.svg; done

# Mutation score (specs/ASSURANCE.md, "Mutation score"): mutmut mutates the
# semantics modules listed in [tool.mutmut] (pyproject.toml) into ./mutants and
# runs the selected tests against each mutant; results are cached in ./mutants
# (delete it for a from-scratch run). Opt-in: `make test` does not run it.
# CI=1 selects Hypothesis's "ci" profile (derandomized, no deadline, no database),
# so a mutant's verdict does not depend on timing or on earlier runs.
MUTATION_CHILDREN ?= 2
mutation: $(STAMP_DEV)
	mkdir -p mutants && printf '*\n' > mutants/.gitignore
	CI=1 TURNSTILE_MUTATION=1 nice -n 10 $(BIN)/mutmut run --max-children $(MUTATION_CHILDREN)
	$(BIN)/mutmut export-cicd-stats
	@$(BIN)/python -c "import json; s = json.load(open('mutants/mutmut-cicd-stats.json')); \
	d = s['killed'] + s['timeout'] + s['suspicious'] + s['segfault']; \
	print(json.dumps(s)); print(f\"detected {d} of {s['total']} mutants = {100 * d / s['total']:.1f}% \
	(before removing the equivalent mutants listed in bench/mutation/equivalent-*.md)\")"
	@$(BIN)/mutmut results

# The sampled score (hours become tens of minutes): a reproducible random sample of the
# mutants not evaluated yet, stratified by module, is run (mutmut lists no mutant before
# its first run, so in a fresh clone `generate` first writes them without running any);
# then the estimate combines every evaluated mutant with the sample's rate per module
# (.ci/mutation_sample.py), counting the survivors bench/mutation/killed-*.txt lists as
# killed and leaving out the ones bench/mutation/equivalent-*.md judges equivalent (it also
# prints the strict score, which counts those as survivors). The evidence lives in
# bench/mutation/: the sample plan is kept there as sample-plan.json, the estimate as
# estimate.txt (specs/ASSURANCE.md, "Mutation score", quotes it with its date).
# The fraction the evidence in bench/mutation/ was measured with (about 45 minutes on 2 cores;
# 0.12 gives a tighter bound in about 2.5 hours).
MUTATION_FRACTION ?= 0.04
MUTATION_SEED ?= 2026
MUTATION_RECORDS ?= bench/mutation
mutation-sample: $(STAMP_DEV)
	mkdir -p mutants && printf '*\n' > mutants/.gitignore
	test -f mutants/sample.json || { $(BIN)/python .ci/mutation_sample.py generate \
		--max-children $(MUTATION_CHILDREN) && $(BIN)/python .ci/mutation_sample.py pick \
		--fraction $(MUTATION_FRACTION) --seed $(MUTATION_SEED) > mutants/sample.json.new && \
		mv mutants/sample.json.new mutants/sample.json; }
	CI=1 TURNSTILE_MUTATION=1 nice -n 10 $(BIN)/mutmut run --max-children $(MUTATION_CHILDREN) \
		$$($(BIN)/python .ci/mutation_sample.py names mutants/sample.json)
	$(BIN)/python .ci/mutation_sample.py estimate mutants/sample.json \
		--killed $(wildcard $(MUTATION_RECORDS)/killed-*.txt) \
		--equivalent $(wildcard $(MUTATION_RECORDS)/equivalent-*.md) > $(MUTATION_RECORDS)/estimate.txt
	cat $(MUTATION_RECORDS)/estimate.txt
	cp mutants/sample.json $(MUTATION_RECORDS)/sample-plan.json

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .pytest_cache .ruff_cache

# The conformance corpus (specs/conformance/vectors) and the example logs (specs/examples) are
# generated from machine/conformance/corpus/; tests/test_conformance_vectors.py fails when the
# checked-in files are stale (`python -m machine.conformance.corpus --check` says which).
.PHONY: corpus
corpus: $(STAMP_RUN)
	$(BIN)/python -m machine.conformance.corpus
	$(BIN)/python -m machine.conformance.corpus.examples

# Benchmarks (issue #8): runs every item in bench/ (one process each) and writes BENCHMARKS.md
# with the machine description. Takes about 20 minutes; no timing is asserted anywhere.
# `$(BIN)/python -m bench.run --quick --out /tmp/b.md` is a seconds-long smoke run.
# `make bench BEFORE=<rev>` adds item before-after: the commit <rev> against the working tree,
# measured in the same run (bench/before_after.py).
$(STAMP_BENCH): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	touch $@

.PHONY: bench
bench: $(STAMP_RUN) $(STAMP_BENCH)
	$(BIN)/python -m bench.run $(if $(BEFORE),--before $(BEFORE))
