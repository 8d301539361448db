# Leaseboard: `make demo` serves the dashboard with embedded workers; `make test` runs everything.
SHELL := /bin/bash
PYTHON ?= python3
PORT ?= 8000
AMQP_PORT ?= 5672
CHAOS_SECONDS ?= 300
VENV := .venv
PY := $(VENV)/bin/python
# Virtual environments are rebuilt only when pyproject.toml changes, so a second run starts at once.
HASH := $(shell sha1sum pyproject.toml 2>/dev/null | cut -c1-12)
STAMP := $(VENV)/.installed-$(HASH)
PIP_INSTALL := -m pip install --quiet --disable-pip-version-check
# The fast suites on the other supported Pythons: pytest-xdist workers each (0: one process).
FAST_WORKERS ?= 2
# pytest-xdist workers of the whole suite. Most of its time is waiting (servers, processes, timeouts,
# Microsoft's livetest's own sleeps), so more workers than cores; tests/conftest.py starts the longest first.
# Not more than four: six kept the cores busier on a quiet machine (81 % against 68 %, 12 min 49 s), but
# under ci-under-load's busy core the suite took 16 min 40 s and three timing bounds broke.
TEST_WORKERS ?= 4
# pytest-xdist workers of `make check`'s fast suite (4 take 2 min 50 s here; 6 no less: the 2 cores are busy).
CHECK_WORKERS ?= 4
# Bytecode is cached even where the environment says not to (this machine sets PYTHONDONTWRITEBYTECODE):
# the suite starts hundreds of Python processes (workers, consoles, benches), and without the cache
# each compiled the repository's modules from source again (about 0.1 CPU second, a fifth of a
# worker's imports). __pycache__ is ignored by git.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test check test-pythons bench screenshots chaos stress lint check-deploy venv system-deps clean

venv: $(STAMP)

# Each install step prints what it runs and how long it took (.ci/step.sh).
$(STAMP): pyproject.toml
	@test -x $(PY) || bash .ci/step.sh "virtual environment $(VENV)" $(PYTHON) -m venv $(VENV)
	@bash .ci/step.sh "pip in $(VENV)" $(PY) $(PIP_INSTALL) --upgrade pip
	@bash .ci/step.sh "Leaseboard and its test dependencies in $(VENV)" $(PY) $(PIP_INSTALL) -e ".[test]"
	@rm -f $(VENV)/.installed-*
	@touch $@

venv-%: .venv-%/.installed-$(HASH)
	@:
.PRECIOUS: .venv-%/.installed-$(HASH)

# .venv-X.Y: the same, on the Python X.Y that .ci/pythons.sh finds (pyenv's, or pythonX.Y on PATH).
.venv-%/.installed-$(HASH): pyproject.toml
	@python=$$(bash .ci/pythons.sh - | awk -v v=$* '$$1 == v { print $$2 }'); \
		if [ -z "$$python" ] || [ "$$python" = - ]; then echo "no Python $* on this machine" >&2; exit 1; fi; \
		test -x .venv-$*/bin/python || bash .ci/step.sh "virtual environment .venv-$*" "$$python" -m venv .venv-$*
	@bash .ci/step.sh "pip in .venv-$*" .venv-$*/bin/python $(PIP_INSTALL) --upgrade pip
	@bash .ci/step.sh "Leaseboard and its test dependencies in .venv-$*" .venv-$*/bin/python $(PIP_INSTALL) -e ".[test]"
	@rm -f .venv-$*/.installed-*
	@touch $@

system-deps:
	@bash .ci/system-deps.sh

demo: venv
	@mkdir -p var
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py ensureadmin
	@# The embedded hub also speaks Event Hubs' AMQP (runhub prints its connection string); it stops with serve.
	@$(PY) manage.py runhub --port $(AMQP_PORT) & hub=$$!; \
		trap 'kill $$hub 2>/dev/null; wait $$hub 2>/dev/null' EXIT; \
		$(PY) manage.py serve --port $(PORT)

# The manual (mkdocs.yml, docs/) is built in strict mode: a broken link or anchor, a page left out of the
# navigation or a setting without its comment (docs/hooks/settings_reference.py) fails. Into site/ (ignored).
lint: venv
	$(VENV)/bin/ruff check balancer dashboard workers tests docs/hooks manage.py
	$(VENV)/bin/ruff format --check balancer dashboard workers tests docs/hooks manage.py
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy docs/hooks
	$(VENV)/bin/lint-imports --no-cache
	$(PY) .ci/sizes.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir site

check-deploy: venv
	DJANGO_SETTINGS_MODULE=dashboard.production DJANGO_SECRET_KEY="$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(50))')" \
		$(PY) manage.py check --deploy --fail-level WARNING

# Lint and the whole suite on the default Python (PYTHON), then the fast suites on the other supported
# ones, whose environments are built in the background meanwhile (.ci/test.sh).
test: venv system-deps
	@bash .ci/test.sh $(PY) $(VENV) $(TEST_WORKERS) $(FAST_WORKERS)

# The developers' loop: lint, then every test not marked slow (a few minutes). `make test` runs it all.
check: venv system-deps lint
	$(VENV)/bin/pytest -m "not slow" -n $(CHECK_WORKERS) --dist loadgroup -q -p no:cacheprovider

# The fast suite (everything not marked slow) on each other supported Python found on this machine,
# each in its own .venv-X.Y (see .ci/test-pythons.sh). `make test-pythons` runs only these.
test-pythons: system-deps
	@DEFAULT_PYTHON="$$(test -x $(PY) && echo $(PY) || echo $(PYTHON))" FAST_WORKERS="$(FAST_WORKERS)" \
		bash .ci/test-pythons.sh

# The manual's pictures of the console (docs/images/), taken by the browser test that checks each page.
screenshots: venv system-deps
	LEASEBOARD_SCREENSHOTS=docs $(VENV)/bin/pytest -p no:cacheprovider -q tests/dashboard/test_screenshots.py

bench: venv system-deps
	$(PY) -m tests.benchmarks.run

# Fault injection, long version: random faults for CHAOS_SECONDS seconds per store (PostgreSQL,
# Azurite, Redis). `make test` runs the short version.
chaos: venv system-deps
	CHAOS_SECONDS=$(CHAOS_SECONDS) $(VENV)/bin/pytest tests/chaos/test_chaos.py -p no:cacheprovider -q

# Issue 40's proofs at their full size, with one core kept busy as ci-under-load does: every listener
# cancelled 500 times at random points, and a `runworkers` on Redis stopped by SIGTERM 100 times in a
# row (`make test` runs the same tests with 30 stops).
stress: venv system-deps
	@$(PY) -c 'while True: pass' & hog=$$!; trap 'kill $$hog 2>/dev/null' EXIT; \
		STOP_BOUND_STOPS=100 $(VENV)/bin/pytest -p no:cacheprovider -q -rP -n 2 \
			tests/contract/test_listeners_stop.py tests/redis/test_stop_bound.py

clean:
	rm -rf $(VENV) .venv-3.* var site test-artifacts .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
