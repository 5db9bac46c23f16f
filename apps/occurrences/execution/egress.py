"""Every outbound HTTP call Tick makes for a tenant (the webhook handler's, alert webhooks'),
under one total wall-clock deadline.

Per-socket timeouts bound each read, not the call: a receiver that answers `HTTP/1.1 200 OK`
and then one header byte every few seconds never trips a 30 s read timeout and holds the
calling worker slot for as long as it likes. So each call gets a `CallDeadline`:
- the DNS lookup runs on a helper thread the caller stops waiting for at the deadline
  (getaddrinfo cannot be interrupted; the abandoned thread ends when the resolver gives up);
- connecting waits at most the connect timeout, never past the deadline;
- a watchdog thread, outside the socket reads, shuts the connection's socket down at the
  deadline (or as soon as the caller's cancel event is set): a read blocked in it returns at
  once, whatever the receiver does, and the call fails with `EgressDeadlineExceeded`
  (transient). A call not finished by its deadline failed, even if some bytes came back.
The SSRF guard (ssrf.py) runs inside the same deadline: resolve once, check every address,
connect to the checked one.

This is the one module for outbound HTTP (docs/security.md, "Outbound calls"): the URL check
before any lookup (`url_refusal`, at configuration time), the signed POST (`webhook_post`:
signing under the tenant's secrets, the SSRF guard, the deadline) and what a status means
(`classify_response`, `retry_after_s`). Its callers: the webhook handler (webhook.py) and
alert delivery (apps/occurrences/alerts/); neither touches ssrf.py or the signing itself.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any

import urllib3
from django.conf import settings
from django.utils import timezone
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.exceptions import SSLError as Urllib3SSLError

from apps.occurrences.execution.handlers import PermanentError, TransientError
from apps.occurrences.execution.ssrf import (
    Allowlist,
    ResolvedTarget,
    SSRFRefused,
    check_url,
    resolve_target,
)
from apps.occurrences.observability import metrics
from apps.tenants.errors import SigningUnavailable
from apps.tenants.models import Tenant
from apps.tenants.signing import webhook_signature_headers

# How often the watchdog looks at the caller's cancel event (the deadline itself is exact).
CANCEL_POLL_S = 0.5
# Bytes of the response body kept (for the error message); the rest is never read.
SNIPPET_BYTES = 512
USER_AGENT = "Tick-Webhook/1"
# Statuses whose Retry-After is honoured (RFC 9110 also allows it on 3xx, never followed here).
RETRY_AFTER_STATUSES = frozenset({429, 503})


class EgressDeadlineExceeded(TransientError):
    """The call did not finish within its total deadline (or its caller was canceled)."""


@dataclass(frozen=True)
class EgressResponse:
    status: int
    snippet: bytes  # the first SNIPPET_BYTES of the body
    location: str | None
    retry_after: str | None


def allowlist() -> Allowlist:
    return Allowlist.parse(settings.TICK_WEBHOOK_ALLOWLIST)


def tenant_ports(tenant_id: uuid.UUID) -> frozenset[int]:
    """The ports besides 80 and 443 the tenant's outbound calls may use, as stored now."""
    ports = (
        Tenant.objects.filter(id=tenant_id).values_list("webhook_allowed_ports", flat=True).first()
    )
    return frozenset(ports or ())


def url_refusal(url: Any, *, extra_ports: Collection[int]) -> str | None:
    """Why the SSRF guard refuses `url` before any DNS lookup (scheme, host, port, a literal
    address), or None when it may be called; the connect-time guard still checks every
    resolved address at each call."""
    try:
        check_url(url, allowlist=allowlist(), extra_ports=extra_ports)
    except SSRFRefused as exc:
        return str(exc)
    return None


def egress_deadline_s(run_limit_s: float | None = None) -> float:
    """The total deadline of one call: `TICK_EGRESS_DEADLINE_S`, never past the caller's own
    remaining run time (a handler attempt's limit)."""
    limit = float(settings.TICK_EGRESS_DEADLINE_S)
    return limit if run_limit_s is None else max(0.001, min(limit, float(run_limit_s)))


class CallDeadline:
    """A total deadline for one call, kept by a watchdog thread while the block runs.

    Sockets registered with `watch` are shut down (both directions) when the deadline passes
    or `cancel` is set; `tripped` tells afterwards whether that happened."""

    def __init__(self, seconds: float, *, cancel: threading.Event | None = None) -> None:
        self.seconds = seconds
        self.cancel = cancel
        self.expires_at = time.monotonic() + seconds
        self.tripped = threading.Event()
        self.reason = ""
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._watchdog = threading.Thread(target=self._watch, name="tick-egress", daemon=True)

    def __enter__(self) -> CallDeadline:
        self._watchdog.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done.set()
        self._watchdog.join()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            sock.close()

    def remaining(self) -> float:
        return max(0.0, self.expires_at - time.monotonic())

    def check(self) -> None:
        """Raise EgressDeadlineExceeded if the deadline passed or the caller was canceled."""
        if self.tripped.is_set() or self.remaining() <= 0:
            self._trip(self.reason or "deadline")
            raise self.error()

    def error(self) -> EgressDeadlineExceeded:
        if self.reason == "canceled":
            return EgressDeadlineExceeded("outbound call stopped: its run was asked to stop")
        return EgressDeadlineExceeded(
            f"outbound call exceeded its total deadline of {self.seconds:g} s"
        )

    def watch(self, sock: socket.socket) -> None:
        """Shut `sock`'s connection down at the deadline. A duplicate descriptor is kept:
        shutting it down ends the connection even after TLS took the original over."""
        dup = sock.dup()
        with self._lock:
            if not self.tripped.is_set():
                self._sockets.append(dup)
                return
        _shut(dup)
        dup.close()

    def _watch(self) -> None:
        while True:
            left = self.remaining()
            if left <= 0:
                self._trip("deadline")
                return
            if self.cancel is not None and self.cancel.is_set():
                self._trip("canceled")
                return
            wait_s = left if self.cancel is None else min(left, CANCEL_POLL_S)
            if self._done.wait(wait_s):
                return

    def _trip(self, reason: str) -> None:
        with self._lock:
            if self.tripped.is_set():
                return
            self.reason = reason
            self.tripped.set()
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed or never connected: nothing left to stop
        pass


class _WatchedHTTPConnection(HTTPConnection):
    def __init__(self, *args: Any, egress_deadline: CallDeadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._egress_deadline = egress_deadline

    def _new_conn(self) -> socket.socket:
        # For HTTPS this runs before the TLS handshake, which a hostile receiver can stretch
        # as well: the socket is watched from its connect on.
        sock = super()._new_conn()
        self._egress_deadline.watch(sock)
        return sock


class _WatchedHTTPSConnection(_WatchedHTTPConnection, HTTPSConnection):
    """HTTPS with the same watch: `_WatchedHTTPConnection` comes first in the lookup, so its
    `__init__` and `_new_conn` wrap HTTPSConnection's."""


def _pool(resolved: ResolvedTarget, deadline: CallDeadline) -> urllib3.HTTPConnectionPool:
    target = resolved.target
    address = str(resolved.address)
    remaining = max(0.001, deadline.remaining())
    timeout = urllib3.Timeout(
        connect=min(settings.TICK_WEBHOOK_CONNECT_TIMEOUT_S, remaining),
        read=min(settings.TICK_WEBHOOK_READ_TIMEOUT_S, remaining),
    )
    pool: urllib3.HTTPConnectionPool
    if target.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            address, target.port, timeout=timeout, retries=False, maxsize=1,
            server_hostname=target.host, assert_hostname=target.host,
            cert_reqs="CERT_REQUIRED", egress_deadline=deadline,
        )  # fmt: skip
        pool.ConnectionCls = _WatchedHTTPSConnection
        return pool
    pool = urllib3.HTTPConnectionPool(
        address, target.port, timeout=timeout, retries=False, maxsize=1, egress_deadline=deadline
    )
    pool.ConnectionCls = _WatchedHTTPConnection
    return pool


def _resolve_within(
    url: str, *, allowlist: Allowlist, extra_ports: Collection[int], deadline: CallDeadline
) -> ResolvedTarget:
    """`resolve_target` on a helper thread, waited for until the deadline at most."""
    outcome: dict[str, Any] = {}

    def lookup() -> None:
        try:
            outcome["target"] = resolve_target(url, allowlist=allowlist, extra_ports=extra_ports)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            outcome["error"] = exc

    helper = threading.Thread(target=lookup, name="tick-egress-dns", daemon=True)
    helper.start()
    helper.join(deadline.remaining())
    if helper.is_alive():
        deadline.check()  # past the deadline: raises
    if "error" in outcome:
        raise outcome["error"]
    target: ResolvedTarget = outcome["target"]
    return target


def egress_post(
    *,
    url: str,
    body: bytes,
    headers: dict[str, str],
    allowlist: Allowlist,
    extra_ports: Collection[int],
    deadline_s: float,
    cancel: threading.Event | None = None,
) -> EgressResponse:
    """POST `body` to `url` through the SSRF guard (the checked address is the one connected
    to; no redirects, no proxy from the environment), all of it within `deadline_s`; the
    `Host` header is set here. Returns the response's status and first bytes whatever the
    status; raises PermanentError (a refused target or TLS certificate) or TransientError
    (DNS, connection, timeout, `EgressDeadlineExceeded`)."""
    with CallDeadline(deadline_s, cancel=cancel) as deadline:
        try:
            resolved = _resolve_within(
                url, allowlist=allowlist, extra_ports=extra_ports, deadline=deadline
            )
        except SSRFRefused as exc:
            metrics.webhook_refused.inc()
            raise PermanentError(f"webhook target refused: {exc}") from None
        except OSError as exc:  # DNS failure: may be temporary
            raise TransientError(f"could not resolve webhook host: {exc}") from None
        deadline.check()
        pool = _pool(resolved, deadline)
        try:
            response = pool.urlopen(
                "POST", resolved.target.request_path, body=body,
                headers={**headers, "Host": resolved.target.host_header},
                redirect=False, retries=False, preload_content=False, assert_same_host=False,
            )  # fmt: skip
            try:
                snippet = response.read(SNIPPET_BYTES, decode_content=False)
            finally:
                response.release_conn()
        except Urllib3SSLError as exc:
            deadline.check()
            if isinstance(
                exc.__context__, ssl.SSLCertVerificationError
            ) or "CERTIFICATE_VERIFY" in str(exc):
                raise PermanentError(f"webhook TLS certificate refused: {exc}") from None
            raise TransientError(f"webhook TLS error: {exc}") from None
        except (Urllib3Error, OSError) as exc:
            deadline.check()
            raise TransientError(f"webhook request failed: {exc}") from None
        finally:
            pool.close()
        deadline.check()  # a call that ended only because its socket was shut down failed
    return EgressResponse(
        response.status,
        snippet,
        location=response.headers.get("Location"),
        retry_after=response.headers.get("Retry-After"),
    )


def webhook_post(
    *,
    url: str,
    body: bytes,
    headers: dict[str, str],
    tenant_id: uuid.UUID,
    message_id: str,
    extra_ports: frozenset[int] | None = None,
    run_limit_s: float | None = None,
    cancel: threading.Event | None = None,
) -> int:
    """POST a JSON `body` to `url` through the SSRF guard (the resolved address is the one
    connected to; ports 80/443 or the tenant's; no redirects, no proxies), signed with the
    tenant's secrets under `message_id`; returns the 2xx status or raises
    `PermanentError`/`TransientError`. Shared by the webhook handler and alert webhooks; the
    whole call, DNS to last byte, within `TICK_EGRESS_DEADLINE_S` and `run_limit_s`, stopped
    early when `cancel` is set (egress.py)."""
    if extra_ports is None:
        extra_ports = tenant_ports(tenant_id)
    headers = {
        **headers,
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        **signed_headers(tenant_id=tenant_id, message_id=message_id, body=body),
    }
    response = egress_post(
        url=url, body=body, headers=headers, allowlist=allowlist(), extra_ports=extra_ports,
        deadline_s=egress_deadline_s(run_limit_s), cancel=cancel,
    )  # fmt: skip
    return classify_response(
        response.status,
        response.snippet,
        location=response.location,
        retry_after=response.retry_after,
    )


def signed_headers(*, tenant_id: uuid.UUID, message_id: str, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers for `body`, the exact bytes sent: the id is the
    occurrence id (or an alert's id; the same on every retry and redelivery), the signature
    is made with each of the tenant's active secrets (docs/webhooks.md)."""
    try:
        return webhook_signature_headers(tenant_id=tenant_id, message_id=message_id, body=body)
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
