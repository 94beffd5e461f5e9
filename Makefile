# `make demo`, `make test` and `make bench` each create (and then reuse) the virtual environment.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.installed
# checkov pins its dependencies exactly: it gets a virtual environment of its own, which tests/infra runs.
CHECKOV_VENV := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed
AZURITE := node_modules/.bin/azurite-blob
# The oldest azure-functions a Functions host may load (requirements-azure-functions-oldest.txt says where
# that pin comes from), installed apart from the venv: one test puts it first on a process's path.
OLDEST_AZURE_FUNCTIONS := .azure-functions-oldest
OLDEST_STAMP := $(OLDEST_AZURE_FUNCTIONS)/.installed

.PHONY: demo test lint typecheck bench docs clean

demo: $(VENV_STAMP)
	$(VENV)/bin/retrain demo

# The suite starts hundreds of Python processes (torchrun workers, pipeline steps). Where the environment
# sets PYTHONDONTWRITEBYTECODE, each would compile the project's modules again; compiled once here, every
# process reads them (Python checks each against its source, so a stale one is never used).
test: $(VENV_STAMP) $(CHECKOV_STAMP) $(AZURITE) $(OLDEST_STAMP) lint typecheck
	$(PY) -m compileall -q core training components function_app demo retrain_cli.py function_entry.py > /dev/null
	$(PY) -m pytest -n 2 --dist loadfile

lint: $(VENV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# What it checks is pyproject.toml's [tool.mypy] `files`: the core, the engine, checkpoints and the ledger.
typecheck: $(VENV_STAMP)
	$(VENV)/bin/mypy

bench: $(VENV_STAMP) $(AZURITE)
	$(PY) bench/trainer.py
	$(PY) bench/pipeline.py
	$(PY) bench/triggers.py
	$(PY) bench/data_scale.py

# The documentation site (mkdocs.yml), into site/, which git ignores. --strict fails on any warning: a broken
# link or anchor, or a page missing from the nav. tests/test_docs_site.py builds it the same way.
docs: $(VENV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

$(VENV_STAMP): requirements.txt requirements-dev.txt components/environment/requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --config-settings editable_mode=compat -e .
	touch $@

$(CHECKOV_STAMP): requirements-checkov.txt
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-checkov.txt
	touch $@

$(OLDEST_STAMP): requirements-azure-functions-oldest.txt $(VENV_STAMP)
	rm -rf $(OLDEST_AZURE_FUNCTIONS)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --target $(OLDEST_AZURE_FUNCTIONS) -r requirements-azure-functions-oldest.txt
	touch $@

$(AZURITE): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) $(OLDEST_AZURE_FUNCTIONS) node_modules .retrain .pytest_cache .ruff_cache .mypy_cache site
