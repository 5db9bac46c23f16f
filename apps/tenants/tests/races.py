"""Run work in threads released together: each thread has its own database connection, so
the work really races on PostgreSQL row locks."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection


def run_at_once(n: int, work: Callable[[int], Any]) -> list[Any]:
    """`work(i)` for i in 0..n-1, one thread each; a raised exception is returned as the
    result, and a thread still running after a minute leaves None. Each thread closes its
    own connection."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = work(i)
        except Exception as exc:  # noqa: BLE001 - returned to the caller's assertions
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results
