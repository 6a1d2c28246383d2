# airflow-repl: `make demo` runs the product on its embedded sandbox; `make test` runs the suite
# (`make test-unit`: only the unit tests, in seconds); `make lint` checks style and types
# (`make format` fixes what it can).  Each installs whatever is missing first (see scripts/bootstrap.sh).
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PATH := $(abspath $(VENV))/bin:$(PATH)

#: Python sources under ruff: the package, and the code around it.
LINT_PATHS := airflow_repl tests benchmarks dags scripts setup.py

.PHONY: install demo test lint format bench sandbox-stop clean

install: $(STAMP)

#: setup.py builds the compiled module (airflow_repl/engine/agents/_command_lines.c): installed again when it changes
$(STAMP): setup.cfg setup.py pyproject.toml scripts/bootstrap.sh airflow_repl/engine/agents/_command_lines.c
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/bootstrap.sh
	touch $(STAMP)

demo: install
	$(VENV)/bin/airflow-repl demo

test: install
	$(PY) -m pytest -q tests/unit
	$(PY) -m pytest -q tests/integration

# tests/unit: no server, no Spark, no network; seconds.  tests/integration: real servers and Spark.
.PHONY: test-unit test-integration
test-unit: install
	$(PY) -m pytest -q tests/unit

test-integration: install
	$(PY) -m pytest -q tests/integration

lint: install
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff check --fix $(LINT_PATHS)
	$(VENV)/bin/ruff format $(LINT_PATHS)

#: Arguments of benchmarks/native_compare.py (airflow-repl against PostgreSQL's native logical
#: replication, docs/performance.md).  Its defaults (pgbench scale 10, 100k transactions, 1,000 tps for
#: 30 s, then the sustained rate: 60 s per step of 500 tps) take 10 to 20 minutes; e.g. a quick run:
#: make bench BENCH_NATIVE="--scale 1 --transactions 2000 --lag-seconds 10 --sustained-window 15"
BENCH_NATIVE ?=
#: Arguments of benchmarks/memory_bound.py (peak memory of the agents on one transaction of 5M row
#: changes and a backlog of 10M: about 40 minutes here); e.g. BENCH_MEMORY="--backlog 1000000"
BENCH_MEMORY ?=
#: Arguments of benchmarks/mariadb_catchup.py (a pgbench backlog to a MariaDB subscriber beside a
#: PostgreSQL one; 100,000 transactions by default); e.g. BENCH_MARIADB="--transactions 10000"
BENCH_MARIADB ?=

#: Arguments of benchmarks/add_article.py (one article added to a live publication, against a full
#: reinitialize and native's REFRESH PUBLICATION); e.g. make bench BENCH_ADD_ARTICLE="--scale 1 --article-rows 10000"
BENCH_ADD_ARTICLE ?=

bench: install
	$(PY) -m compileall -q airflow_repl > /dev/null  # the agents start as from an installed package, not compiling sources
	$(PY) benchmarks/native_compare.py $(BENCH_NATIVE)
	$(PY) benchmarks/memory_bound.py --bulk-apply $(BENCH_MEMORY)
	$(PY) benchmarks/throughput.py
	$(PY) benchmarks/streams.py
	$(PY) benchmarks/queue_reader.py
	$(PY) benchmarks/topology_scale.py
	$(PY) benchmarks/add_article.py $(BENCH_ADD_ARTICLE)
	$(PY) benchmarks/mariadb_catchup.py $(BENCH_MARIADB)

sandbox-stop:
	-$(VENV)/bin/airflow-repl sandbox stop

clean:
	-$(VENV)/bin/airflow-repl sandbox destroy
	rm -rf $(VENV)
