"""A worker's pool process keeps its database connection from task to task (a new backend
per occurrence cost PostgreSQL more than the claim and completion together), and still drops
one past CONN_MAX_AGE or broken, as Django does per request."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from celery.fixups.django import DjangoWorkerFixup  # type: ignore[attr-defined]
from django.db import connection

from tickweb.celery import _close_old_connections, app


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
