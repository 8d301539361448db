# Leaseboard: `make demo` serves the dashboard with embedded workers; `make test` runs everything.
SHELL := /bin/bash
PYTHON ?= python3
PORT ?= 8000
AMQP_PORT ?= 5672
CHAOS_SECONDS ?= 300
VENV := .venv
PY := $(VENV)/bin/python
# The virtual environment is rebuilt only when pyproject.toml changes, so a second run starts at once.
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml 2>/dev/null | cut -c1-12)
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: demo test bench chaos lint check-deploy venv system-deps clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[test]"
	@rm -f $(VENV)/.installed-*
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

lint: venv
	$(VENV)/bin/ruff check balancer dashboard workers tests manage.py
	$(VENV)/bin/mypy

check-deploy: venv
	DJANGO_SETTINGS_MODULE=dashboard.production DJANGO_SECRET_KEY="$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(50))')" \
		$(PY) manage.py check --deploy --fail-level WARNING

test: venv system-deps lint
	$(PY) manage.py makemigrations --check --dry-run -v 0
	$(VENV)/bin/pytest

bench: venv system-deps
	$(PY) -m tests.benchmarks.run

# Fault injection, long version: random faults for CHAOS_SECONDS seconds per store (PostgreSQL,
# Azurite, Redis). `make test` runs the short version.
chaos: venv system-deps
	CHAOS_SECONDS=$(CHAOS_SECONDS) $(VENV)/bin/pytest tests/chaos/test_chaos.py -p no:cacheprovider -q

clean:
	rm -rf $(VENV) var test-artifacts .pytest_cache .mypy_cache .ruff_cache
