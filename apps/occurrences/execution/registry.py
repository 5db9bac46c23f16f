"""Every handler Tick can run, under the name a schedule gives it: the one list to read.

Handlers are deployed with Tick; a tenant only picks one by name. To add one, write its
function against the contract in handlers.py and add one entry to `HANDLERS`. Nothing
registers itself on import: what is not in this literal (or, for the demo handlers, in
`DEMO_HANDLERS` of demo_handlers.py and named by `TICK_EXTRA_HANDLERS`) does not exist.
The setting is read at each lookup, so the API, the UI and the worker see the same set.

Each entry pairs what the worker runs (run.py) with the payload validator the schedules API
and UI call at create, update and preview (with the schedule's tenant); a validator raises
`PayloadError`, which the API answers as 400 on `payload`. Validators check only what needs
no network: the webhook's target is resolved and checked again at each run (webhook.py),
since DNS answers change. Each entry also declares the handler's default run-time limit,
which a schedule's `timeout_s` may replace (deadlines.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings

from apps.occurrences.execution.handlers import Handler, noop_handler
from apps.occurrences.execution.webhook import validate_webhook_payload, webhook_handler
from apps.tenants.models import Tenant


class PayloadValidator(Protocol):
    """Raises PayloadError for a payload the handler cannot use on behalf of `tenant` (its
    own limits, e.g. the webhook's port allowlist; None: the defaults)."""

    def __call__(self, payload: Any, *, tenant: Tenant | None = None) -> None: ...


@dataclass(frozen=True)
class HandlerSpec:
    run: Handler
    # Raises PayloadError (field, message) for a payload the handler cannot use.
    validate_payload: PayloadValidator
    # Run-time limit of one attempt when the schedule sets no `timeout_s` (deadlines.py).
    default_timeout_s: int


def any_json_payload(payload: Any, *, tenant: Tenant | None = None) -> None:
    """Accept any JSON value: the API has already parsed it and capped its size."""


def webhook_default_timeout_s() -> int:
    """One request's connect and read timeouts (webhook.py), plus room for the DNS lookup
    and the body: the read timeout bounds each read, not the whole response."""
    timeouts_s = settings.TICK_WEBHOOK_CONNECT_TIMEOUT_S + settings.TICK_WEBHOOK_READ_TIMEOUT_S
    return math.ceil(timeouts_s) + 30


HANDLERS: Mapping[str, HandlerSpec] = {
    "noop": HandlerSpec(run=noop_handler, validate_payload=any_json_payload, default_timeout_s=10),
    "webhook": HandlerSpec(
        run=webhook_handler,
        validate_payload=validate_webhook_payload,
        default_timeout_s=webhook_default_timeout_s(),
    ),
}


def available_handlers() -> Mapping[str, HandlerSpec]:
    """The production built-ins plus the demo handlers `TICK_EXTRA_HANDLERS` names.

    Read at call time, not import time, so a deployment's setting and a test's override are
    what every caller sees. A name that is no demo handler is skipped here (and refused by
    `manage.py check`); a demo entry never shadows a production one.
    """
    # Imported here: demo_handlers builds its entries from HandlerSpec, defined above.
    from apps.occurrences.execution.demo_handlers import DEMO_HANDLERS

    names = settings.TICK_EXTRA_HANDLERS
    return {**{name: DEMO_HANDLERS[name] for name in names if name in DEMO_HANDLERS}, **HANDLERS}


def handler_spec(name: str) -> HandlerSpec | None:
    """The handler a schedule names, or None for a name this deployment does not offer."""
    return available_handlers().get(name)


def handler_names() -> list[str]:
    return sorted(available_handlers())
