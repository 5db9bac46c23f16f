"""The built-in `webhook` handler: POST JSON to the URL the tenant gave in the payload.

Payload (validated at schedule create by `validate_webhook_payload`, again at run time):
    {"url": "https://example.com/hook", "body": <any JSON, default {}>,
     "headers": {"X-Name": "value", ...}}          # optional, string values

Request: `POST url`, `Content-Type: application/json`, `Idempotency-Key: <occurrence_id>`,
`User-Agent: Tick-Webhook/1`, the signature headers `webhook-id` (the occurrence id),
`webhook-timestamp` and `webhook-signature` (`signed_headers`, docs/webhooks.md), plus the
tenant's headers (not the reserved ones). Connect and read timeouts from settings; redirects
are never followed; no proxy from the environment.

SSRF guard at connect time: the host is resolved once by `ssrf.resolve_target`, every address
is checked, and urllib3 connects to that checked address literal (TLS still verifies the
certificate for, and sends SNI of, the URL's host name), so a DNS answer that changes between
check and connect cannot redirect the request.

Outcome classes: 2xx success; 408, 429 and 5xx transient (retried); 3xx (redirect not
followed) and every other 4xx permanent (DEAD); connection errors and timeouts transient;
certificate verification failures and SSRF refusals permanent.

A 429 or 503 with `Retry-After` (delta-seconds or an HTTP-date) carries the wait on its
`TransientError`; the completion (complete.py) schedules the retry no earlier, capped at the
occurrence's retry deadline. A malformed header is ignored (the usual backoff applies).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import urllib3
from django.conf import settings
from django.utils import timezone
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.exceptions import SSLError as Urllib3SSLError

from apps.occurrences.execution.handlers import (
    HandlerContext,
    PayloadError,
    PermanentError,
    TransientError,
)
from apps.occurrences.execution.ssrf import (
    Allowlist,
    ResolvedTarget,
    SSRFRefused,
    check_url,
    resolve_target,
)
from apps.occurrences.observability import metrics
from apps.tenants.errors import SigningUnavailable
from apps.tenants.signing import SIGNATURE_HEADERS, webhook_signature_headers

RESERVED_HEADERS = frozenset(
    {"host", "content-length", "content-type", "idempotency-key", "transfer-encoding",
     "connection", "user-agent", "expect", "te", "upgrade", "proxy-authorization",
     *SIGNATURE_HEADERS}
)  # fmt: skip
MAX_BODY_BYTES = 256 * 1024
MAX_HEADERS = 20
USER_AGENT = "Tick-Webhook/1"
# Statuses whose Retry-After is honoured (RFC 9110 also allows it on 3xx, never followed here).
RETRY_AFTER_STATUSES = frozenset({429, 503})


class WebhookPayloadError(PayloadError):
    """The webhook payload is invalid: `field` names the offending key."""


def allowlist() -> Allowlist:
    return Allowlist.parse(settings.TICK_WEBHOOK_ALLOWLIST)


def validate_webhook_payload(payload: Any) -> None:
    """Raise WebhookPayloadError (field, message) unless `payload` is a valid webhook payload.

    Checks everything that needs no DNS (the connect-time guard still resolves and checks
    every address at each run): the webhook's validator in registry.py, called by the
    schedules serializer at create/update.
    """
    if not isinstance(payload, Mapping):
        raise WebhookPayloadError("payload", "must be an object with a 'url'")
    unknown = set(payload) - {"url", "body", "headers"}
    if unknown:
        raise WebhookPayloadError("payload", f"unknown keys: {', '.join(sorted(unknown))}")
    try:
        check_url(payload.get("url"), allowlist=allowlist())  # type: ignore[arg-type]
    except SSRFRefused as exc:
        raise WebhookPayloadError("url", str(exc)) from None
    headers = payload.get("headers", {})
    if not isinstance(headers, Mapping) or len(headers) > MAX_HEADERS:
        raise WebhookPayloadError("headers", f"must be an object of at most {MAX_HEADERS}")
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise WebhookPayloadError("headers", "names and values must be strings")
        if name.lower() in RESERVED_HEADERS:
            raise WebhookPayloadError("headers", f"{name!r} is set by Tick")
        if any(ch in name + value for ch in "\r\n\0") or not name.strip():
            raise WebhookPayloadError("headers", f"{name!r} has an invalid name or value")
    if len(_body_bytes(payload.get("body", {}))) > MAX_BODY_BYTES:
        raise WebhookPayloadError("body", f"must encode to at most {MAX_BODY_BYTES} bytes")


def _body_bytes(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _pool(resolved: ResolvedTarget, timeout: urllib3.Timeout) -> urllib3.HTTPConnectionPool:
    target = resolved.target
    address = str(resolved.address)
    if target.scheme == "https":
        return urllib3.HTTPSConnectionPool(
            address,
            target.port,
            timeout=timeout,
            retries=False,
            maxsize=1,
            server_hostname=target.host,
            assert_hostname=target.host,
            cert_reqs="CERT_REQUIRED",
        )
    return urllib3.HTTPConnectionPool(
        address, target.port, timeout=timeout, retries=False, maxsize=1
    )


def webhook_send(*, ctx: HandlerContext) -> int:
    """Send one webhook for `ctx`; returns the 2xx status or raises a classified error."""
    payload = ctx.payload
    try:
        validate_webhook_payload(payload)
        resolved = resolve_target(payload["url"], allowlist=allowlist())
    except SSRFRefused as exc:
        metrics.webhook_refused.inc()
        raise PermanentError(f"webhook target refused: {exc}") from None
    except WebhookPayloadError as exc:
        if exc.field == "url":
            metrics.webhook_refused.inc()
        raise
    except OSError as exc:  # DNS failure: may be temporary
        raise TransientError(f"could not resolve webhook host: {exc}") from None
    body = _body_bytes(payload.get("body", {}))
    headers = {
        **payload.get("headers", {}),
        "Host": resolved.target.host_header,
        "Content-Type": "application/json",
        "Idempotency-Key": str(ctx.occurrence_id),
        "User-Agent": USER_AGENT,
        **signed_headers(ctx=ctx, body=body),
    }
    timeout = urllib3.Timeout(
        connect=settings.TICK_WEBHOOK_CONNECT_TIMEOUT_S, read=settings.TICK_WEBHOOK_READ_TIMEOUT_S
    )
    pool = _pool(resolved, timeout)
    try:
        response = pool.urlopen(
            "POST",
            resolved.target.request_path,
            body=body,
            headers=headers,
            redirect=False,
            retries=False,
            preload_content=False,
            assert_same_host=False,
        )
        try:
            snippet = response.read(512, decode_content=False)
        finally:
            response.release_conn()
    except Urllib3SSLError as exc:
        if isinstance(exc.__context__, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY" in str(
            exc
        ):
            raise PermanentError(f"webhook TLS certificate refused: {exc}") from None
        raise TransientError(f"webhook TLS error: {exc}") from None
    except (Urllib3Error, OSError) as exc:
        raise TransientError(f"webhook request failed: {exc}") from None
    finally:
        pool.close()
    return classify_response(
        response.status,
        snippet,
        location=response.headers.get("Location"),
        retry_after=response.headers.get("Retry-After"),
    )


def signed_headers(*, ctx: HandlerContext, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers for `body`, the exact bytes sent: the id is the
    occurrence id (the same on every retry and redelivery), the signature is made with each
    of the tenant's active secrets (docs/webhooks.md)."""
    try:
        return webhook_signature_headers(
            tenant_id=ctx.tenant_id, message_id=str(ctx.occurrence_id), body=body
        )
    except SigningUnavailable as exc:
        # An operator's key configuration, not the receiver: retrying cannot help; replay
        # from the DLQ once the key is restored.
        raise PermanentError(f"webhook not signed: {exc}") from None


def classify_response(
    status: int, snippet: bytes, *, location: str | None = None, retry_after: str | None = None
) -> int:
    """Return `status` when it is a success, else raise the error of its class."""
    text = snippet.decode(errors="replace")[:200]
    if 200 <= status < 300:
        return status
    if status in (408, 429) or status >= 500:
        wait_s = retry_after_s(retry_after) if status in RETRY_AFTER_STATUSES else None
        asked = "" if wait_s is None else f" (Retry-After: {wait_s:.0f} s)"
        raise TransientError(f"webhook answered HTTP {status}{asked}: {text}", retry_after_s=wait_s)
    if 300 <= status < 400:
        raise PermanentError(
            f"webhook answered HTTP {status} (redirect to {location!r} not followed)"
        )
    raise PermanentError(f"webhook answered HTTP {status}: {text}")


def retry_after_s(header: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds a `Retry-After` header asks to wait, or None when absent or malformed.

    Delta-seconds or an HTTP-date (a date already past asks 0 s). Never negative, and never
    more than TICK_RETRY_DEADLINE_S — no retry is scheduled later than that anyway, and a
    huge value must not overflow the date arithmetic of the completion.
    """
    if header is None:
        return None
    value = header.strip()
    longest_s = float(settings.TICK_RETRY_DEADLINE_S)
    if value.isascii() and value.isdigit():
        # A digit string too long to be a plausible wait is not parsed at all.
        return min(float(value), longest_s) if len(value) <= 12 else longest_s
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000" zone: HTTP-dates are GMT
        when = when.replace(tzinfo=UTC)
    wait_s = (when - (now or timezone.now())).total_seconds()
    return min(max(wait_s, 0.0), longest_s)


def webhook_handler(ctx: HandlerContext) -> None:
    webhook_send(ctx=ctx)
