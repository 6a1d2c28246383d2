# airflow-repl: `make demo` runs the product on its embedded sandbox; `make test` runs the suite
# (`make test-unit`: only the unit tests, in seconds).
# Both install whatever is missing first (see scripts/bootstrap.sh).
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: install demo test bench sandbox-stop clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml scripts/bootstrap.sh
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

bench: install
	$(PY) benchmarks/throughput.py
	$(PY) benchmarks/streams.py

sandbox-stop:
	-$(VENV)/bin/airflow-repl sandbox stop

clean:
	-$(VENV)/bin/airflow-repl sandbox destroy
	rm -rf $(VENV)
