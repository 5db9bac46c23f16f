"""The PostgreSQL settings Tick assumes: `make run`/`make test` apply them to a server they
start (scripts/ensure_services.py), and a database system check warns when a server's
settings would make its WAL mostly full-page images."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import psycopg
import pytest
from django.core import checks
from django.db import connections

from apps.occurrences.tests.support.private_postgres import PrivatePostgres
from tickweb.checks import check_pg_settings, pg_settings_warnings

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "ensure_services.py"
STOCK = {"max_wal_size": "1024", "checkpoint_timeout": "300", "wal_compression": "off"}


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ensure_services", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("ensure_services", module)
    spec.loader.exec_module(module)
    return module


def _settings(dsn: str, names: list[str]) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [names]
        ).fetchall()
    return {str(name): str(value) for name, value in rows}


def _ids(messages: list[checks.CheckMessage]) -> list[str | None]:
    return [message.id for message in messages]


def test_stock_settings_are_warned_about_one_by_one():
    assert _ids(pg_settings_warnings(STOCK)) == ["tick.W030", "tick.W031", "tick.W032"]
    tuned = {"max_wal_size": "16384", "checkpoint_timeout": "900", "wal_compression": "lz4"}
    assert pg_settings_warnings(tuned) == []
    assert _ids(pg_settings_warnings({**tuned, "checkpoint_timeout": "300"})) == ["tick.W031"]


def test_the_check_runs_only_where_database_checks_run():
    assert check_pg_settings(databases=None) == []


@pytest.mark.django_db
def test_the_check_reads_the_server_it_runs_on():
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
            [["max_wal_size", "checkpoint_timeout", "wal_compression"]],
        )
        values = dict(cursor.fetchall())
    assert _ids(check_pg_settings(databases=["default"])) == _ids(pg_settings_warnings(values))


def test_a_server_the_script_starts_gets_the_settings_and_passes_the_check():
    server = PrivatePostgres(database="tick_settings")
    try:
        server.init()
        before = _settings(server.dsn(), list(STOCK))
        assert _ids(pg_settings_warnings(before)) == ["tick.W030", "tick.W031", "tick.W032"]
        script = _script()
        script.pg_apply_settings(script.parse_pg_url(server.url))
        after = _settings(server.dsn(), list(script.PG_SETTINGS))
        assert pg_settings_warnings(after) == []
        assert after["autovacuum_naptime"] == "15" and after["min_wal_size"] == "2048"
    finally:
        server.destroy()
