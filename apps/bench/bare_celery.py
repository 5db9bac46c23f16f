"""Bare Celery on Tick's broker: the floor of Celery's own cost per task, no Tick and no
database (bench_sustained `--workers`, execution_path.bare_celery_floor).

A worker of this app runs `bare.noop` with the settings Tick's workers run with (JSON only,
late acks, requeue on a lost pool process, prefetch 1, no results), so the cost per task of
publishing (`apply_async`), RabbitMQ and the prefork worker is comparable with Tick's per
executed occurrence. This module imports no Django: the worker is Celery alone.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

BROKER_ENV = "TICK_BARE_BROKER_URL"
TASK_NAME = "bare.noop"

app = Celery("tick_bare", broker=os.environ.get(BROKER_ENV, "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)


@app.task(name=TASK_NAME)
def noop(**_: Any) -> None:
    """Does nothing: what is measured is everything around it."""
