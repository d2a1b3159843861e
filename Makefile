# The two commands of the README: `make demo` runs the whole system on one machine, `make test`
# runs the test suite. Both set themselves up: virtual environment, requirements, local SQS server.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
DEPS := $(VENV)/.requirements-installed localsqs/node_modules/.package-lock.json
# LocalStack (requirements-localstack.txt) runs on Python 3.13; pyenv's shim for python3.13 answers
# only where 3.13 is the selected version, so an installed 3.13 is looked for behind it too.
LOCALSTACK_PYTHON ?= $(firstword $(foreach p,python3.13 $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13),$(shell $(p) -c '' 2>/dev/null && echo $(p))))
LOCALSTACK_VENV := .venv-localstack
LOCALSTACK := $(LOCALSTACK_VENV)/.requirements-installed

.PHONY: deps localstack test lint demo bench chaos clean

deps: $(DEPS)

localstack: $(LOCALSTACK)

$(VENV)/.requirements-installed: requirements.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

$(LOCALSTACK): requirements-localstack.txt
	@test -n "$(LOCALSTACK_PYTHON)" || { echo "Python 3.13 not found: install it (LocalStack's SQS for make test)"; exit 1; }
	test -x $(LOCALSTACK_VENV)/bin/python || $(LOCALSTACK_PYTHON) -m venv $(LOCALSTACK_VENV)
	$(LOCALSTACK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LOCALSTACK_VENV)/bin/python -m pip install --quiet -r requirements-localstack.txt
	touch $@

localsqs/node_modules/.package-lock.json: localsqs/package-lock.json
	cd localsqs && npm ci --no-audit --no-fund --loglevel=error

lint: deps
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The SQS-heavy modules, run a second time against LocalStack (tests/localstack.py). fauxqs returns
# at most one message per group per receive; LocalStack, like AWS at times, returns several of one
# group in one receive, in order, so only there does the worker's partial-batch path (a batch's
# group heads in one transaction, the rest of each group one by one, stopped at a failure and the
# remainder released) meet a real server. These are the modules that drive the worker over the
# queues and lean on FIFO semantics: group order, visibility and receive counts, RedrivePolicy,
# the DLQ, queue attributes (test_setup_queues), and held messages released back into their group
# (triage/test_actions). The rest only send to SQS or read its counts: fauxqs covers them.
LOCALSTACK_TESTS ?= \
	tests/callbacks/test_worker.py \
	tests/callbacks/test_worker_partial_batch.py \
	tests/callbacks/test_worker_batch.py \
	tests/callbacks/test_worker_backoff.py \
	tests/callbacks/test_worker_breaker.py \
	tests/callbacks/test_worker_submit.py \
	tests/callbacks/test_worker_processes.py \
	tests/callbacks/test_holds.py \
	tests/callbacks/test_unstorable_messages.py \
	tests/callbacks/test_breaker_outage.py \
	tests/callbacks/test_outbox.py \
	tests/callbacks/test_sqs_gateway.py \
	tests/callbacks/test_setup_queues.py \
	tests/triage/test_actions.py

test: deps $(LOCALSTACK)
	scripts/ensure-chromium
	scripts/ensure-faketime
	scripts/ensure-promtool
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) manage.py makemigrations --check --dry-run --settings=config.settings.test >/dev/null
	$(PY) -m pytest $(PYTEST_ARGS)
	$(if $(LOCALSTACK_TESTS),TEST_SQS_SERVER=localstack $(PY) -m pytest $(LOCALSTACK_TESTS))
	# The module inside a foreign host project (its own settings, user model and URLs).
	$(PY) -m pytest --ds=tests.host.settings tests/host

demo: deps
	$(PY) demo/run.py

# Benchmarks (docs/benchmarks.md); sizes from BENCH_* variables, e.g. BENCH_PAYMENTS=2000.
bench: deps
	$(PY) bench/run.py

# Faults injected into the whole stack, then the invariant checker (the chaos package); sizes from
# CHAOS_* variables, e.g. CHAOS_PAYMENTS=150 (default 1000), CHAOS_SECONDS, CHAOS_SEED.
chaos: deps
	$(PY) -m chaos

clean:
	rm -rf $(VENV) $(LOCALSTACK_VENV) localsqs/node_modules var .pytest_cache .ruff_cache
