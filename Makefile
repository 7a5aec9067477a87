# capdisc: `make up` runs the embedded stack, `make test` runs the whole suite.
# Both set everything up themselves on a machine with only Python 3.11+.

PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.capdisc-installed

.PHONY: install up test unit integration lint format bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "capdisc needs Python 3.11 or newer (set PYTHON=...)")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing capdisc and its dependencies into $(VENV) (the first time downloads about"
	@echo "a hundred packages and takes a few minutes; pip lists each one as it goes)"
	$(PY) -m pip install --disable-pip-version-check --progress-bar on -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

up: install
	$(VENV)/bin/capdisc up

test: install
	$(PY) -m pytest

unit: install
	$(PY) -m pytest tests/unit

integration: install
	$(PY) -m pytest tests/integration

CODE = shared workers producers tests benchmarks examples scripts

lint: install
	$(VENV)/bin/ruff check $(CODE)
	$(VENV)/bin/ruff format --check $(CODE)
	$(VENV)/bin/mypy shared/capdisc workers/capdisc_workers producers/capdisc_producers
	$(VENV)/bin/lint-imports

format: install
	$(VENV)/bin/ruff format $(CODE)
	$(VENV)/bin/ruff check --fix $(CODE)

bench: install
	$(PY) benchmarks/retrieval.py
	$(PY) benchmarks/generalization.py
	$(PY) benchmarks/metatool_labels.py
	$(PY) benchmarks/model_latency.py
	$(PY) benchmarks/discovery_speed.py
	$(PY) benchmarks/change_to_served.py
	$(PY) benchmarks/bulk_import.py
	$(PY) benchmarks/discovery_memory.py
	$(PY) benchmarks/reliability.py
	$(PY) benchmarks/reindex_availability.py
	$(PY) benchmarks/session_overhead.py
	$(PY) benchmarks/session_failover.py

clean:
	rm -rf $(VENV) .capdisc .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
