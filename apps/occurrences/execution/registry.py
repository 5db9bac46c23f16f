"""Every handler Tick can run, under the name a schedule gives it: the one list to read.

Handlers are deployed with Tick; a tenant only picks one by name. To add one, write its
function against the contract in handlers.py and add one entry to `HANDLERS`. Nothing
registers itself on import: what is not in this literal does not exist.

Each entry pairs what the worker runs (run.py) with the payload validator the schedules API
and UI call at create and update; a validator raises `PayloadError`, which the API answers
as 400 on `payload`. Validators check only what needs no network: the webhook's target is
resolved and checked again at each run (webhook.py), since DNS answers change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from apps.occurrences.execution.handlers import Handler, noop_handler, record_handler
from apps.occurrences.execution.webhook import validate_webhook_payload, webhook_handler

PayloadValidator = Callable[[Any], None]


@dataclass(frozen=True)
class HandlerSpec:
    run: Handler
    # Raises PayloadError (field, message) for a payload the handler cannot use.
    validate_payload: PayloadValidator


def any_json_payload(payload: Any) -> None:
    """Accept any JSON value: the API has already parsed it and capped its size."""


HANDLERS: Mapping[str, HandlerSpec] = {
    "noop": HandlerSpec(run=noop_handler, validate_payload=any_json_payload),
    "record": HandlerSpec(run=record_handler, validate_payload=any_json_payload),
    "webhook": HandlerSpec(run=webhook_handler, validate_payload=validate_webhook_payload),
}


def handler_spec(name: str) -> HandlerSpec | None:
    """The handler a schedule names, or None for a name Tick does not have."""
    return HANDLERS.get(name)


def handler_names() -> list[str]:
    return sorted(HANDLERS)
