"""A worker's pool process keeps its database connection from task to task (a new backend
per occurrence cost PostgreSQL more than the claim and completion together), and still drops
one past CONN_MAX_AGE or broken, as Django does per request."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from celery.fixups.django import DjangoWorkerFixup  # type: ignore[attr-defined]
from django.db import connection

import tickweb.celery
from tickweb.celery import (
    HEALTH_CHECK_AFTER_IDLE_S,
    _close_old_connections,
    _skip_health_check_when_busy,
    _worker_connection_age,
    app,
)


def _task() -> SimpleNamespace:
    return SimpleNamespace(request=SimpleNamespace(is_eager=False))


@pytest.mark.django_db(transaction=True)
def test_celery_does_not_close_the_connection_around_a_task():
    fixup = DjangoWorkerFixup(app)
    connection.ensure_connection()
    raw = connection.connection

    fixup.on_task_prerun(sender=_task())
    fixup.on_task_postrun(sender=_task())

    assert connection.connection is raw


@pytest.mark.django_db(transaction=True)
def test_a_connection_past_its_age_is_closed_after_a_task():
    connection.ensure_connection()
    raw = connection.connection
    _close_old_connections()
    assert connection.connection is raw  # young and healthy: kept

    connection.close_at = time.monotonic() - 1
    _close_old_connections()
    assert connection.connection is None


@pytest.mark.django_db(transaction=True)
def test_a_worker_keeps_its_connection_past_the_web_age(settings):
    # given: the web's CONN_MAX_AGE is 60 s, the worker's 600 s
    settings.TICK_WORKER_CONN_MAX_AGE = 600
    db = connection.settings_dict
    web_age = db["CONN_MAX_AGE"]
    try:
        _worker_connection_age()
        connection.close()
        connection.ensure_connection()
        raw = connection.connection
        opened_at = time.monotonic()

        # when: a task ends two minutes after the connection opened
        assert connection.close_at is not None and connection.close_at >= opened_at + 590
        connection.close_at -= 120
        _close_old_connections()

        # then: it is kept; past the worker's age it is replaced
        assert connection.connection is raw
        connection.close_at -= 600
        _close_old_connections()
        assert connection.connection is None
    finally:
        db["CONN_MAX_AGE"] = web_age


def _count_health_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    checks: list[int] = []
    usable = connection.is_usable

    def counted() -> bool:
        checks.append(1)
        return usable()

    monkeypatch.setattr(connection, "is_usable", counted)
    return checks


def _next_task_uses_the_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 2")


@pytest.mark.django_db(transaction=True)
def test_a_connection_busy_from_task_to_task_is_not_health_checked(monkeypatch):
    # given: a task just ended on a healthy connection
    connection.ensure_connection()
    checks = _count_health_checks(monkeypatch)
    _close_old_connections()

    # when: the next task starts at once and runs a statement
    _skip_health_check_when_busy()
    _next_task_uses_the_database()

    # then: no `SELECT 1` before it
    assert checks == []


@pytest.mark.django_db(transaction=True)
def test_a_connection_idle_between_tasks_is_health_checked(monkeypatch):
    connection.ensure_connection()
    checks = _count_health_checks(monkeypatch)
    _close_old_connections()
    monkeypatch.setattr(
        tickweb.celery, "_last_task_end", tickweb.celery._last_task_end - HEALTH_CHECK_AFTER_IDLE_S
    )

    _skip_health_check_when_busy()
    _next_task_uses_the_database()

    assert checks == [1]
