"""Fixtures of the fault tests: private RabbitMQ nodes (support/private_rabbitmq.py), booted
once per test module."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.occurrences.tests.support.private_rabbitmq import PrivateRabbitMQ, rabbitmq_tool


def _started(root: Path, count: int) -> Iterator[PrivateRabbitMQ]:
    if rabbitmq_tool("rabbitmq-server") is None or rabbitmq_tool("rabbitmqctl") is None:
        pytest.skip("rabbitmq-server is not installed on this machine")
    rabbit = PrivateRabbitMQ(root, count)
    try:
        began = time.monotonic()
        rabbit.start()
        if count > 1:
            rabbit.form_cluster()
        sys.stdout.write(
            f"private RabbitMQ: {count} node(s) up in {time.monotonic() - began:.1f}s "
            f"({rabbit.broker_url})\n"
        )
        yield rabbit
    except BaseException:
        for node in rabbit.nodes:
            sys.stdout.write(rabbit.log_tail(node) + "\n")
        raise
    finally:
        rabbit.close()


# Module-scoped: booting costs seconds. Each test calls `restore()` before it starts, so
# it finds every node up again after a test that stopped or killed one.
@pytest.fixture(scope="module")
def private_rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRabbitMQ]:
    """One private RabbitMQ node; its URL is `.broker_url`."""
    yield from _started(tmp_path_factory.mktemp("rabbitmq"), 1)


@pytest.fixture(scope="module")
def rabbitmq_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRabbitMQ]:
    """Three private nodes in one cluster; `.broker_url` lists all three (`;`)."""
    yield from _started(tmp_path_factory.mktemp("rabbitmq-cluster"), 3)
