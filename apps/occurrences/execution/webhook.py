"""The built-in `webhook` handler: POST JSON to the URL the tenant gave in the payload.

Payload (validated at schedule create, update and preview by `validate_webhook_payload`,
again at run time, where a failure is permanent: DEAD at once):
    {"url": "https://example.com/hook", "body": <any JSON, default {}>,
     "headers": {"X-Name": "value", ...},          # optional: `check_headers`
     "envelope": false}                            # optional: wrap the body with the context

The URL's port must be 80, 443 or one the tenant's `webhook_allowed_ports` names.

Request: `POST url`, `Content-Type: application/json`, `Idempotency-Key: <occurrence_id>`,
`User-Agent: Tick-Webhook/1`, the signature headers `webhook-id` (the occurrence id),
`webhook-timestamp` and `webhook-signature` (egress.py `signed_headers`, docs/webhooks.md), the run
context `Tick-Scheduled-For`, `Tick-Attempt`, `Tick-Schedule-Id`, `Tick-Schedule-Version` and
`Tick-Origin` (`context_headers`; not signed, so with `"envelope": true` the body is
`{"context": {...}, "payload": <body>}`, signed with it), plus the tenant's headers (not the
reserved ones). Connect and read timeouts from settings, and one
total deadline for the whole call (egress.py: `TICK_EGRESS_DEADLINE_S`, never past the
attempt's run-time limit; a cancel stops it too); redirects are never followed; no proxy
from the environment.

SSRF guard at connect time: the host is resolved once by `ssrf.resolve_target`, every address
is checked, and urllib3 connects to that checked address literal (TLS still verifies the
certificate for, and sends SNI of, the URL's host name), so a DNS answer that changes between
check and connect cannot redirect the request. The signed POST, the guard and the deadline are
egress.py's, shared with alert delivery; this module is the handler: payload, headers, context.

Outcome classes (egress.py `classify_response`): 2xx success; 408, 429 and 5xx transient
(retried); 3xx (redirect not followed) and every other 4xx permanent (DEAD); connection errors
and timeouts transient; certificate verification failures and SSRF refusals permanent.

A 429 or 503 with `Retry-After` (delta-seconds or an HTTP-date) carries the wait on its
`TransientError`; the completion (complete.py) schedules the retry no earlier, capped at the
occurrence's retry deadline. A malformed header is ignored (the usual backoff applies).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from typing import Any

from apps.occurrences.execution.egress import tenant_ports, url_refusal, webhook_post
from apps.occurrences.execution.handlers import (
    HandlerContext,
    PayloadError,
)
from apps.occurrences.observability import metrics
from apps.tenants.models import Tenant
from apps.tenants.signing import SIGNATURE_HEADERS

# The run context (HandlerContext.run_context) as request headers: name -> context key.
CONTEXT_HEADERS = {
    "Tick-Scheduled-For": "scheduled_for",
    "Tick-Attempt": "attempt",
    "Tick-Schedule-Id": "schedule_id",
    "Tick-Schedule-Version": "schedule_version",
    "Tick-Origin": "origin",
}
# Headers a tenant may not set: Tick writes them (Host, Content-Type, Content-Length,
# Idempotency-Key, User-Agent), they are hop-by-hop (RFC 9110 7.6.1: Connection, Keep-Alive,
# TE, Trailer, Transfer-Encoding, Upgrade, Proxy-*), or they change how the request is framed
# or routed (Expect). A forged framing header would smuggle a second request to the target.
RESERVED_HEADERS = frozenset(
    {"host", "content-length", "content-type", "idempotency-key", "transfer-encoding",
     "connection", "keep-alive", "proxy-connection", "user-agent", "expect", "te", "trailer",
     "upgrade", "proxy-authorization", "proxy-authenticate",
     *SIGNATURE_HEADERS, *(name.lower() for name in CONTEXT_HEADERS)}
)  # fmt: skip
# RFC 7230 3.2.6 `token`: the only characters a header name may have.
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
MAX_HEADER_NAME_CHARS = 128
MAX_HEADER_VALUE_CHARS = 4096
MAX_HEADERS_CHARS = 16 * 1024  # names and values together
MAX_BODY_BYTES = 256 * 1024
MAX_HEADERS = 20


class WebhookPayloadError(PayloadError):
    """The webhook payload is invalid: `field` names the offending key."""


def webhook_ports_of(tenant: Tenant | None) -> frozenset[int]:
    """The ports besides 80 and 443 the tenant's webhooks may call (none without a tenant)."""
    return frozenset(tenant.webhook_allowed_ports) if tenant is not None else frozenset()


def validate_webhook_payload(payload: Any, *, tenant: Tenant | None = None) -> None:
    """Raise WebhookPayloadError (field, message) unless `payload` is a valid webhook payload
    for `tenant` (its port allowlist; without a tenant only 80 and 443).

    Checks everything that needs no DNS (the connect-time guard still resolves and checks
    every address at each run): the webhook's validator in registry.py, called by the
    schedules serializer at create, update and preview, and again before each send.
    """
    check_webhook_payload(payload, extra_ports=webhook_ports_of(tenant))


def check_webhook_payload(payload: Any, *, extra_ports: Collection[int]) -> None:
    if not isinstance(payload, Mapping):
        raise WebhookPayloadError("payload", "must be an object with a 'url'")
    unknown = set(payload) - {"url", "body", "headers", "envelope"}
    if unknown:
        raise WebhookPayloadError("payload", f"unknown keys: {', '.join(sorted(unknown))}")
    refusal = url_refusal(payload.get("url"), extra_ports=extra_ports)
    if refusal is not None:
        raise WebhookPayloadError("url", refusal)
    check_headers(payload.get("headers", {}))
    if not isinstance(payload.get("envelope", False), bool):
        raise WebhookPayloadError("envelope", "must be true or false")
    if len(_body_bytes(payload.get("body", {}))) > MAX_BODY_BYTES:
        raise WebhookPayloadError("body", f"must encode to at most {MAX_BODY_BYTES} bytes")


def check_headers(headers: Any) -> None:
    """The tenant's extra request headers: an object of at most MAX_HEADERS names, each an
    RFC 7230 token that Tick does not reserve (RESERVED_HEADERS), given once in any letter
    case; each value a string of Latin-1 characters (what HTTP/1.1 carries) without CR, LF,
    NUL or other control characters but tab; bounded sizes. Raises WebhookPayloadError on
    `headers`, naming the header."""
    if not isinstance(headers, Mapping):
        raise WebhookPayloadError("headers", "must be an object of header names to values")
    if len(headers) > MAX_HEADERS:
        raise WebhookPayloadError("headers", f"at most {MAX_HEADERS} headers, got {len(headers)}")
    seen: set[str] = set()
    total = 0
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise WebhookPayloadError(
                "headers", f"{str(name)[:40]!r} is not a valid header name (an RFC 7230 token)"
            )
        if len(name) > MAX_HEADER_NAME_CHARS:
            raise WebhookPayloadError(
                "headers", f"header names have at most {MAX_HEADER_NAME_CHARS} characters"
            )
        folded = name.lower()
        if folded in RESERVED_HEADERS:
            raise WebhookPayloadError(
                "headers", f"{name!r} is reserved (set by Tick or hop-by-hop)"
            )
        if folded in seen:
            raise WebhookPayloadError("headers", f"{name!r} is given twice (names ignore case)")
        seen.add(folded)
        if not isinstance(value, str):
            raise WebhookPayloadError("headers", f"the value of {name!r} must be a string")
        if len(value) > MAX_HEADER_VALUE_CHARS:
            raise WebhookPayloadError(
                "headers",
                f"the value of {name!r} is longer than {MAX_HEADER_VALUE_CHARS} characters",
            )
        if any(ord(ch) > 0xFF for ch in value):
            raise WebhookPayloadError(
                "headers", f"the value of {name!r} has characters outside Latin-1"
            )
        if any((ord(ch) < 0x20 and ch != "\t") or ord(ch) == 0x7F for ch in value):
            raise WebhookPayloadError(
                "headers", f"the value of {name!r} has a control character (CR, LF, NUL, …)"
            )
        total += len(name) + len(value)
    if total > MAX_HEADERS_CHARS:
        raise WebhookPayloadError(
            "headers", f"names and values together exceed {MAX_HEADERS_CHARS} characters"
        )


def _body_bytes(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def webhook_send(*, ctx: HandlerContext) -> int:
    """Send one webhook for `ctx`; returns the 2xx status or raises a classified error.

    The payload is checked again as at create, against the tenant's port allowlist as it is
    now: a configuration error (bad header, bad URL, a port no longer allowed) is permanent
    (WebhookPayloadError, a PermanentError), so the occurrence goes DEAD at once with the
    reason instead of retrying what cannot succeed."""
    payload = ctx.payload
    extra_ports = tenant_ports(ctx.tenant_id)
    try:
        check_webhook_payload(payload, extra_ports=extra_ports)
    except WebhookPayloadError as exc:
        if exc.field == "url":
            metrics.webhook_refused.inc()
        raise
    run_context = ctx.run_context()
    body = payload.get("body", {})
    if payload.get("envelope", False):
        body = {"context": run_context, "payload": body}
    return webhook_post(
        url=payload["url"],
        body=_body_bytes(body),
        headers={
            **payload.get("headers", {}),
            **context_headers(run_context),
            "Idempotency-Key": str(ctx.occurrence_id),
        },
        tenant_id=ctx.tenant_id,
        message_id=str(ctx.occurrence_id),
        extra_ports=extra_ports,
        run_limit_s=ctx.timeout_s,
        cancel=ctx.cancel_requested,
    )


def context_headers(run_context: Mapping[str, Any]) -> dict[str, str]:
    """The run context as the `Tick-*` request headers (docs/webhooks.md "Run context")."""
    return {name: str(run_context[key]) for name, key in CONTEXT_HEADERS.items()}


def webhook_handler(ctx: HandlerContext) -> None:
    webhook_send(ctx=ctx)
