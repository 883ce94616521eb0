# Entry points for developers and CI. Everything runs from the project virtualenv (.venv),
# which `make setup` creates and keeps in sync with requirements.txt / requirements.lock.
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
PYTHON := $(VENV)/bin/python
LAKEHOUSE := $(VENV)/bin/lakehouse

# Spark's Python workers (and the driver) must use the venv interpreter, not the system
# python3 that lacks pyarrow & co.
export PYSPARK_PYTHON := $(PYTHON)
export PYSPARK_DRIVER_PYTHON := $(PYTHON)

.PHONY: setup demo lint test test-unit test-e2e bench stack-up stack-down clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(PYTHON) scripts/demo.py

# `make test` runs both layers; `make test-unit` the unit layer, tests/unit/<package>/ (not marked slow: no
# Spark, broker, Airflow or `lakehouse` process; tests/conftest.py fails a test that starts one, and stops a
# collection that finds a slow test there), `make test-e2e` the end-to-end layer, tests/e2e/ (every test there
# marked slow by tests/e2e/conftest.py). Each selects by folder and by marker. pytest exits 5 when it collects
# no tests: that is a failure, said plainly. Every test's time is in reports/tests.xml (JUnit XML, as CI servers
# read it).
# `make test` and `make test-e2e` run in XDIST's pytest-xdist workers (each file in one worker, each worker
# with a stack of its own); `make test XDIST=` runs in one process.
XDIST ?= -n 2 --dist loadfile

define pytest
	@rc=0; $(PYTHON) -m pytest -q --durations=30 --junitxml=reports/tests.xml $(1) $(2) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make $@: FAILED: pytest collected no tests (exit code 5)" >&2; fi; \
	exit $$rc
endef

# The product package and its Airflow provider, linted by ruff as pyproject.toml's [tool.ruff] says (`make test`
# and `make test-unit` run it before pytest), and every `# noqa` naming its reason: `# noqa: BLE001 - why it must
# catch everything`. Then mypy type-checks the product package, its Airflow provider, the DAGs and the Spark jobs
# as pyproject.toml's [tool.mypy] says, every `# type: ignore` naming its error code and its reason:
# `# type: ignore[override]  # why`.
LINT_PATHS := include/lakehouse providers/lakehouse dags plugins spark_jobs

lint: setup
	$(VENV)/bin/ruff check $(LINT_PATHS)
	@if grep -rnP --include='*.py' '# noqa(?!: [A-Z]+[0-9]+(, ?[A-Z]+[0-9]+)* - \S)' $(LINT_PATHS); then \
	  echo "make $@: FAILED: the noqa comments above name no reason; write them '# noqa: CODE - why'" >&2; \
	  exit 1; \
	fi
	@if grep -rnP --include='*.py' '# type: ?ignore(?!\[[a-z-]+(, ?[a-z-]+)*\]  # \S)' $(LINT_PATHS); then \
	  echo "make $@: FAILED: the type: ignore comments above name no error code or no reason;" \
	       "write them '# type: ignore[code]  # why'" >&2; \
	  exit 1; \
	fi
	$(VENV)/bin/mypy

test: setup lint
	$(call pytest,$(XDIST),tests/unit tests/e2e)

test-unit: setup lint
	$(call pytest,-m "not slow",tests/unit)

test-e2e: setup
	$(call pytest,$(XDIST) -m slow,tests/e2e)

# The benchmark against the machine's ceilings (about 20 min on 2 cores, the peers included): its own scratch stack on
# broker port 19192, report in reports/bench/report.md. Knobs: BENCH_SCALE, BENCH_RECORDS, BENCH_REPEATS,
# BENCH_PIPELINE_REPEATS, BENCH_PHASE_SECONDS, BENCH_DRAIN_SECONDS (see bench/run.py).
bench:
	@bash scripts/setup.sh --bench
	$(PYTHON) -m bench.run

stack-up: setup
	$(LAKEHOUSE) stack up

stack-down:
	$(LAKEHOUSE) airflow down
	$(LAKEHOUSE) stack down

clean:
	@if [ -x $(LAKEHOUSE) ]; then $(LAKEHOUSE) airflow down; $(LAKEHOUSE) stack down --purge; fi
	rm -rf .lakehouse
