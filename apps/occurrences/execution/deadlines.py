"""Handler deadlines: an attempt's run-time limit, and how a handler past it is stopped.

The limit (`effective_timeout_s`) is the schedule's `timeout_s`, else the handler's
`default_timeout_s` (registry.py), never above the tenant's `max_timeout_s`; the claim puts it
in `ctx.timeout_s`. The heartbeat (heartbeat.py) keeps the clock of the running attempt:
1. At the limit it sets `ctx.cancel_requested` (the soft stop). A handler that then stops by
   raising (`Canceled`, typically) ends its attempt TIMED_OUT (`DeadlineExceeded`: transient,
   retried under the usual policy, complete.py). One that returns normally succeeded: its
   work is done, and a retry would only repeat it.
2. It renews the lease through the grace (`TICK_HANDLER_TIMEOUT_GRACE_S`), never after.
3. At limit + grace a handler still running is reclaimed (run.py): TIMED_OUT is written
   through the normal completion, under the attempt's lease token, then a prefork pool
   process ends at once (`os._exit`). The pool starts a fresh process in its place; the broker
   hands the message back (`reject_on_worker_lost`), and the claim drops that copy as a
   duplicate while the retry of the TIMED_OUT attempt is pending (claim.py, a).
   Under a threads, solo or gevent pool no running thread can be stopped from outside: the
   attempt is still written TIMED_OUT and retried, but the slot stays taken until the handler
   returns, and its late completion is ignored as stale. Hence workers run prefork (the
   Procfile's and Celery's default).
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

from celery import signals

from apps.occurrences.execution.handlers import TransientError

# EX_SOFTWARE: the pool logs the replaced process with this code beside the reclaim message.
HARD_STOP_EXIT_CODE = 70

_in_pool_process = False


def effective_timeout_s(
    *, requested_s: int | None, handler_default_s: int, tenant_max_s: int
) -> int:
    """The run-time limit of an attempt, in seconds (at least 1)."""
    return max(1, min(requested_s or handler_default_s, tenant_max_s))


class DeadlineExceeded(TransientError):
    """The handler was still running at its run-time limit: the attempt ends TIMED_OUT."""


@signals.worker_process_init.connect
def _mark_pool_process(**_: Any) -> None:
    # Sent only in a prefork pool's child processes, the ones that may end themselves.
    global _in_pool_process
    _in_pool_process = True


def in_pool_process() -> bool:
    """True in a prefork pool process, whose replacement the pool takes care of."""
    return _in_pool_process


def end_pool_process() -> NoReturn:
    """End this pool process now, without unwinding the stuck handler's thread."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(HARD_STOP_EXIT_CODE)
