# The two commands of the README: `make demo` runs the whole system on one machine, `make test`
# runs the test suite. Both set themselves up: virtual environment, requirements, local SQS server.
# `make test-fast` is the contributor's loop; `make test-slow` the tiers only CI (.ci/run) runs.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
DEPS := $(VENV)/.requirements-installed localsqs/node_modules/.package-lock.json \
	achinterop/node_modules/.package-lock.json
# LocalStack (requirements-localstack.txt) runs on Python 3.13; pyenv's shim for python3.13 answers
# only where 3.13 is the selected version, so an installed 3.13 is looked for behind it too.
LOCALSTACK_PYTHON ?= $(firstword $(foreach p,python3.13 $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13),$(shell $(p) -c '' 2>/dev/null && echo $(p))))
LOCALSTACK_VENV := .venv-localstack
LOCALSTACK := $(LOCALSTACK_VENV)/.requirements-installed

.PHONY: deps localstack test test-fast test-slow lint demo bench chaos docs docs-check docs-serve \
	docs-reference docs-screenshots clean

deps: $(DEPS)

localstack: $(LOCALSTACK)

$(VENV)/.requirements-installed: requirements.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

$(LOCALSTACK): requirements-localstack.txt
	@test -n "$(LOCALSTACK_PYTHON)" || { echo "Python 3.13 not found: install it (LocalStack's SQS for make test-slow)"; exit 1; }
	test -x $(LOCALSTACK_VENV)/bin/python || $(LOCALSTACK_PYTHON) -m venv $(LOCALSTACK_VENV)
	$(LOCALSTACK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LOCALSTACK_VENV)/bin/python -m pip install --quiet -r requirements-localstack.txt
	touch $@

localsqs/node_modules/.package-lock.json: localsqs/package-lock.json
	cd localsqs && npm ci --no-audit --no-fund --loglevel=error

# Two Node implementations of NACHA files for the parser's interoperability tests.
achinterop/node_modules/.package-lock.json: achinterop/package-lock.json
	cd achinterop && npm ci --no-audit --no-fund --loglevel=error

lint: deps
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# pytest-xdist: one process per core and two more (PYTEST_WORKERS=0 runs in this process): the
# tests wait on servers and processes part of the time, and on this 2-core machine three
# processes ran make test-fast in 118 s against 147 s for two, and four ran make test on a fresh
# clone in 5 min 45 s (its pytest 287 s) against 7 min 11 s (350 s) for three (5 min 1 s, its
# pytest 259 s, after the cuts docs/development.md lists). Tests are handed out one at a time
# in the order tests/conftest.py sets (its LONGEST_FIRST, measured, then the tests that start
# processes; nothing is queued behind a long test but the one its process needs next), but a
# module whose fixture starts gunicorn on a database cluster stays on one process (conftest's
# scheduler for --dist loadgroup); measured here, that beat whole modules per process (--dist
# loadfile) by a sixth. Each process has its own local SQS server, test database (pytest-django's _gw<n>
# suffix), clusters and ports.
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 2 )))
XDIST = -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder
# The slow tiers (markers in pyproject.toml): `subprocess` (worker, gunicorn, celery, relay
# processes, Django in a fresh interpreter), `browser` (chromium) and `scale` (1,000 payments,
# long faults: minutes each). Moved to `scale` to keep make test within 6 minutes on this
# machine, each with a smaller one of its kind left in make test (docs/development.md, "How long
# make test takes"): two of the four modes of the short flap at low traffic
# (tests/callbacks/test_degraded_processor.py, flap_random and round_robin: the same path as the
# periodic flap, 20 to 35 s each of waiting out the flap and its alert's cool-down; make test
# keeps the periodic flap and the pinned connection, the branch of its own); the model test's
# four shards of 50 sequences (make test runs 20); the tutorial's fresh virtualenv from the wheel
# (tests/host's stays); the schema fuzz's full count of cases (make test sends a third); the
# timeout outage of two workers (the 503 outage stays); two workers over 500 payments (make test:
# 100); the day totals' random ledger histories from seeds 1 to 3 (make test: seed 0 in each mode).
FAST = not subprocess and not browser and not scale

# The tests LocalStack runs a second time (make test-slow). fauxqs returns at most one message of
# a group per receive; LocalStack, like AWS at times, returns several of one group in one receive,
# in order, so only there does the worker's partial-batch path (a batch's group heads in one
# transaction, the rest of each group one by one, stopped at a failure and the remainder
# released) meet a real server. Kept: the `localstack_only` tests (test_worker_partial_batch;
# test_worker_crash_loop, where a message that kills real workers is handed out with its group's
# later ones each time; and test_setup_queues, whose queue attributes LocalStack checks as AWS
# does), and the modules
# where a receive, counted under LocalStack, did return several messages of one group: worker,
# worker_batch, worker_breaker, holds and triage/test_actions (held messages released back into
# their group), and the test where two real worker processes share 500 payments' events (its
# receives happen in the workers, so they were not counted), and the processor event sent to
# the back of its group behind the submission it waits for (both may come in one receive). The other modules that talk to SQS
# only send, count, or receive one message per group there: their LocalStack run repeated the
# fauxqs one. And the vault's KMS key holder, against LocalStack's KMS (test_kms, all of it
# `localstack_only`: fauxqs serves no KMS).
LOCALSTACK_TESTS ?= \
	tests/bank/vault/test_kms.py \
	tests/callbacks/test_worker_partial_batch.py \
	tests/callbacks/test_worker_crash_loop.py \
	tests/callbacks/test_setup_queues.py \
	tests/callbacks/test_worker.py \
	tests/callbacks/test_worker_batch.py \
	tests/callbacks/test_worker_breaker.py \
	tests/callbacks/test_holds.py \
	tests/triage/test_actions.py \
	'tests/callbacks/test_worker_processes.py::test_two_workers_apply_the_payments_events_exactly_once_in_order[500-payments]' \
	tests/callbacks/test_worker_submit.py::test_a_settlement_ahead_of_its_payments_submission_goes_behind_it_and_both_apply

# Lint, the migrations check, the docs' build, then every test but the scale tier (in parallel)
# and, beside it, the module inside a foreign host project (its own settings, user model, URLs
# and test database). The host run spends most of its two minutes building fresh virtualenvs
# (pip installing the wheel), little of it on the CPU: run after the main run, as it was, it
# added those minutes to make test's wall time; beside it, its output is printed once the main
# run is done, and make test fails when either fails.
HOST_LOG := var/test-host.log
test: deps
	scripts/ensure-debian-packages chromium promtool sshd faketime
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) manage.py makemigrations --check --dry-run --settings=config.settings.test >/dev/null
	$(MAKE) --no-print-directory docs-check
	@mkdir -p $(dir $(HOST_LOG))
	$(PY) -m pytest --ds=tests.host.settings tests/host >$(HOST_LOG) 2>&1 & host=$$!; \
	$(PY) -m pytest $(XDIST) -m "not scale" $(PYTEST_ARGS); main=$$?; \
	wait $$host; hosted=$$?; \
	echo "--- the host project (tests/host, $(HOST_LOG)):"; cat $(HOST_LOG); \
	test $$main -eq 0 && test $$hosted -eq 0

# The tests that start no process of their own: seconds per change, not minutes.
test-fast: deps
	scripts/ensure-promtool
	$(PY) -m pytest $(XDIST) -m "$(FAST)" $(PYTEST_ARGS)

# What make test leaves to CI: the scale tier, one test at a time (each loads the machine and
# times its recovery), and the LocalStack run.
test-slow: deps $(LOCALSTACK)
	scripts/ensure-faketime
	$(PY) -m pytest -m scale $(PYTEST_ARGS)
	$(if $(LOCALSTACK_TESTS),TEST_SQS_SERVER=localstack $(PY) -m pytest $(XDIST) $(LOCALSTACK_TESTS))

demo: deps
	$(PY) demo/run.py

# Benchmarks (docs/benchmarks.md); sizes from BENCH_* variables, e.g. BENCH_PAYMENTS=2000.
bench: deps
	$(PY) bench/run.py

# Faults injected into the whole stack, then the invariant checker (the chaos package); sizes from
# CHAOS_* variables, e.g. CHAOS_PAYMENTS=150 (default 1000), CHAOS_SECONDS, CHAOS_SEED.
chaos: deps
	$(PY) -m chaos

# The documentation site builds in a virtual environment of its own with requirements-docs.txt
# alone (MkDocs, Material, pymdown-extensions: about 175 MB, against requirements.txt's 850), and
# takes two files from packages it does not install: Mermaid's runtime from its npm tarball (the
# integrity docsassets/package-lock.json pins; scripts/docs_mermaid.py), and the Redoc bundle
# from drf-spectacular-sidecar, installed without its Django. Both are served with the site, so it
# reads offline: the theme would otherwise fetch them from a CDN in the browser.
DOCS_VENV := .venv-docs
DOCS_PY := $(DOCS_VENV)/bin/python
MERMAID_JS := docs/assets/javascripts/mermaid.min.js
REDOC_JS := docs/reference/openapi/redoc.standalone.js
SIDECAR := $(shell sed -n 's/^drf-spectacular-sidecar==//p' requirements.txt)
$(DOCS_VENV)/.requirements-installed: requirements-docs.txt requirements.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11"; exit 1; }
	test -x $(DOCS_PY) || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_PY) -m pip install --quiet -r requirements-docs.txt
	$(DOCS_PY) -m pip install --quiet --no-deps drf-spectacular-sidecar==$(SIDECAR)
	touch $@
$(MERMAID_JS): docsassets/package-lock.json
	$(PYTHON) scripts/docs_mermaid.py $@
$(REDOC_JS): $(DOCS_VENV)/.requirements-installed
	$(DOCS_PY) -c "import importlib.util, pathlib, shutil, sys; \
	root = pathlib.Path(importlib.util.find_spec('drf_spectacular_sidecar').origin).parent; \
	shutil.copyfile(root / 'static/drf_spectacular_sidecar/redoc/bundles/redoc.standalone.js', sys.argv[1])" $@
DOCS_FILES := $(DOCS_VENV)/.requirements-installed $(MERMAID_JS) $(REDOC_JS)

# The documentation site (docs/, mkdocs.yml) into site/, with MkDocs --strict, so a broken link,
# a missing anchor or a page left out of the navigation fails it. Offline: the theme's fonts are
# off and no plugin fetches anything. The references under docs/reference/ are committed (make
# docs-reference writes them again from the code; make test fails when they differ from it).
docs: $(DOCS_FILES)
	$(DOCS_PY) -m mkdocs build --strict --quiet

# The references regenerated from the code (scripts/docs_reference.py: Django's settings, no
# database), in the project's environment: they read the apps' declarations.
docs-reference: $(VENV)/.requirements-installed
	$(PY) scripts/docs_reference.py

# What make test runs: a reference that differs from the code fails, then the same build.
docs-check: $(VENV)/.requirements-installed $(DOCS_FILES)
	$(PY) scripts/docs_reference.py --check
	$(DOCS_PY) -m mkdocs build --strict --quiet

docs-serve: docs
	$(DOCS_PY) -m mkdocs serve --dev-addr 127.0.0.1:8001

# The admin screenshots of docs/img/, taken again in Debian's chromium (commit them).
docs-screenshots: $(VENV)/.requirements-installed
	scripts/ensure-chromium
	DOCS_SCREENSHOTS=1 $(PY) -m pytest tests/triage/test_browser_screenshots.py

clean:
	rm -rf site $(MERMAID_JS) $(REDOC_JS) $(DOCS_VENV) $(VENV) $(LOCALSTACK_VENV) localsqs/node_modules achinterop/node_modules var .pytest_cache .ruff_cache
