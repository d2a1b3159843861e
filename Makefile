# The two commands of the README: `make demo` runs the whole system on one machine, `make test`
# runs the test suite. Both set themselves up: virtual environment, requirements, local SQS server.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
DEPS := $(VENV)/.requirements-installed localsqs/node_modules/.package-lock.json

.PHONY: deps test lint demo bench chaos clean

deps: $(DEPS)

$(VENV)/.requirements-installed: requirements.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

localsqs/node_modules/.package-lock.json: localsqs/package-lock.json
	cd localsqs && npm ci --no-audit --no-fund --loglevel=error

lint: deps
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: deps
	scripts/ensure-chromium
	scripts/ensure-faketime
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) manage.py makemigrations --check --dry-run --settings=config.settings.test >/dev/null
	$(PY) -m pytest $(PYTEST_ARGS)
	# The module inside a foreign host project (its own settings, user model and URLs).
	$(PY) -m pytest --ds=tests.host.settings tests/host

demo: deps
	$(PY) demo/run.py

# Benchmarks (docs/benchmarks.md); sizes from BENCH_* variables, e.g. BENCH_PAYMENTS=2000.
bench: deps
	$(PY) bench/run.py

# Faults injected into the whole stack, then the invariant checker (bench/chaos.py); sizes from
# CHAOS_* variables, e.g. CHAOS_PAYMENTS=150 (default 1000), CHAOS_SECONDS, CHAOS_SEED.
chaos: deps
	$(PY) -m bench.chaos

clean:
	rm -rf $(VENV) localsqs/node_modules var .pytest_cache .ruff_cache
