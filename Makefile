# Two commands for a newcomer: `make run` (the whole stack) and `make test` (lint + suite).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ENV_FILE := .run/services.env

export DJANGO_DEBUG ?= 1
# The bench app (apps/bench/, the bench_* commands) is installed for `make run` and `make test`;
# production settings leave it out (tickweb/settings.py TICK_BENCH).
export TICK_BENCH ?= 1

.PHONY: run test lint pytest pytest-pooler pytest-clock-edge install services services-stop migrate schema clean browsers \
	pgbouncer ha-packages patroni

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

install: $(STAMP)

# Finds PostgreSQL and RabbitMQ (DATABASE_URL / CELERY_BROKER_URL, else localhost), starts
# or installs them when missing, and writes the URLs to use into $(ENV_FILE).
services: install
	$(BIN)/python scripts/ensure_services.py --env-file $(ENV_FILE)

# Stops the embedded PostgreSQL that `services` may have started (data stays on disk).
services-stop: install
	$(BIN)/python scripts/ensure_services.py --stop-embedded-postgres

migrate: services
	set -a && source $(ENV_FILE) && set +a && \
	$(BIN)/python manage.py migrate --noinput && \
	$(BIN)/python manage.py partitions && \
	$(BIN)/python manage.py collectstatic --noinput --verbosity 0

run: migrate
	set -a && source $(ENV_FILE) && set +a && \
	$(BIN)/python manage.py demo_setup --port $${TICK_WEB_PORT:-8000} && \
	exec $(BIN)/honcho start -f Procfile

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	$(BIN)/lint-imports
	$(BIN)/python scripts/check_docs.py
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/python manage.py check --fail-level WARNING
	$(BIN)/python manage.py spectacular --validate --fail-on-warn --file /dev/null

# Headless Chromium for the web UI's browser tests: Debian's packages, never a downloaded
# browser build. A no-op once installed (CI runs as root).
browsers:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends chromium chromium-driver; }

# PgBouncer (Debian's 1.18) for the pooler tests and production's transaction pooling
# (docs/operations.md "PgBouncer"); only the binary is used, the packaged service stays off.
pgbouncer:
	@test -x /usr/sbin/pgbouncer || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends pgbouncer; }

# etcd, Patroni and HAProxy (Debian's packages) for the failover tests; the packaged services
# stay off (no systemd here; elsewhere `systemctl disable` them if only the tests need them).
ha-packages:
	@test -x /usr/bin/patroni -a -x /usr/bin/etcd -a -x /usr/sbin/haproxy || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends patroni etcd-server haproxy; }

# A private etcd + two PostgreSQL nodes under Patroni + HAProxy on their own ports and data
# directories (docs/operations.md "PostgreSQL under Patroni"); prints its DATABASE_URL, Ctrl-C
# removes it.
patroni: install ha-packages
	$(BIN)/python scripts/patroni_cluster.py

# API, web and engine tests again with every connection through a private PgBouncer in
# transaction mode (conftest.py `_through_pgbouncer`): the slower pooler group.
POOLER_SUITE := apps/tenants/tests/test_rls.py apps/tenants/tests/test_pooler_leak.py \
	apps/tenants/tests/test_keys.py apps/tenants/tests/test_idempotency.py \
	apps/tenants/tests/test_rate_limit.py apps/tenants/tests/test_views.py \
	apps/occurrences/schedules/tests/api/test_api.py \
	apps/occurrences/schedules/tests/api/test_api_lifecycle.py \
	apps/occurrences/schedules/tests/api/test_api_concurrency.py \
	apps/occurrences/schedules/tests/web/test_views.py \
	apps/occurrences/tests/interfaces/test_manual_runs_api.py \
	apps/occurrences/tests/interfaces/test_views.py \
	apps/occurrences/tests/execution/test_execution.py

pytest-pooler: services pgbouncer
	set -a && source $(ENV_FILE) && set +a && TICK_TEST_PGBOUNCER=1 $(BIN)/pytest $(POOLER_SUITE)

# The modules marked clock_edge again, each module started at 23:59:50 UTC on the last day of
# the month with the clock running on (conftest.py `--clock-edge`, docs/testing.md).
pytest-clock-edge: services
	set -a && source $(ENV_FILE) && set +a && $(BIN)/pytest -m "clock_edge and not e2e" --clock-edge

pytest: services browsers pgbouncer ha-packages
	set -a && source $(ENV_FILE) && set +a && $(BIN)/pytest
	$(MAKE) --no-print-directory pytest-pooler
	$(MAKE) --no-print-directory pytest-clock-edge

test: lint pytest

# The committed OpenAPI schema (a test fails when it differs from the code).
schema: install
	$(BIN)/python manage.py spectacular --validate --fail-on-warn --file docs/openapi.yaml

clean:
	rm -rf $(VENV) .run staticfiles .mypy_cache .ruff_cache .pytest_cache
