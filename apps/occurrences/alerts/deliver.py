"""Sending one alert message (a single alert or a digest) to its channel, in a worker.

At least once: the message is marked SENT only after the e-mail server or the webhook
receiver accepted it; a worker that dies before that leaves it PENDING and RabbitMQ
redelivers it. Every copy carries the same `Tick-Alert-Id` (the message's id), which a
receiver deduplicates on. A transient failure clears `published_at` and sets `available_at`
for the dispatcher to publish it again after a back-off; a permanent one (a refused address,
a webhook target the SSRF guard refuses) or the last attempt marks it FAILED.

A slow or hostile receiver costs its own tenant only: a webhook send ends by its total
deadline (execution/egress.py), and at most `TICK_ALERT_TENANT_SENDS` messages of a tenant
are sent at once across all workers. A message that finds its tenant's sends taken is not
sent and uses no attempt: it goes back to the dispatcher, to be published again once a send
frees up (`sending_until`, a lease that also frees the slot of a worker that died).
"""

from __future__ import annotations

import json
import logging
import smtplib
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from apps.occurrences.execution.egress import egress_deadline_s, webhook_post
from apps.occurrences.execution.handlers import PermanentError, TransientError
from apps.occurrences.execution.locks import ALERT_SENDS_LOCK, advisory_lock
from apps.occurrences.models import Alert, AlertChannel, AlertDelivery, AlertEvent
from apps.tenants.models import Tenant

log = logging.getLogger(__name__)

ALERT_ID_HEADER = "Tick-Alert-Id"
MAX_BACKOFF_S = 600
# A message whose tenant's sends are all taken is published again after at most this wait.
BUSY_RECHECK_S = 5
# The send lease outlasts the send's own deadline by this much (an e-mail is bounded by
# EMAIL_TIMEOUT per server reply instead).
SENDING_MARGIN_S = 30
SHORT_NAMES = {
    AlertEvent.OCCURRENCE_DEAD: "dead",
    AlertEvent.OCCURRENCE_MISSED: "missed",
    AlertEvent.START_LAG: "start lag",
    AlertEvent.ENQUEUE_LAG: "enqueue lag",
    AlertEvent.SCHEDULE_COMPLETED: "completed",
    AlertEvent.TEST: "test",
}


@dataclass(frozen=True)
class AlertMessage:
    delivery_id: UUID
    tenant_slug: str
    subject: str
    text: str
    document: dict[str, Any]  # the webhook body


def _alert_document(alert: Alert) -> dict[str, Any]:
    return {
        "id": str(alert.id),
        "event": alert.event,
        "subject": alert.subject,
        "schedule_id": str(alert.schedule_id) if alert.schedule_id else None,
        "occurrence_id": str(alert.occurrence_id) if alert.occurrence_id else None,
        "fired_at": alert.fired_at.isoformat().replace("+00:00", "Z"),
        "detail": alert.detail,
    }


def _link(alert: Alert) -> str:
    base = settings.TICK_PUBLIC_URL.rstrip("/")
    if not base:
        return ""
    if alert.occurrence_id:
        return f"{base}/occurrences/{alert.occurrence_id}/"
    if alert.schedule_id:
        return f"{base}/schedules/{alert.schedule_id}/"
    return f"{base}/alerts/"


def one_line(text: str) -> str:
    """`text` with every control character and line or paragraph separator (CR, LF, NUL,
    U+0085, U+2028, …) made a space: names of existing rows may carry them, and in a
    message's header or a digest's line they would break the header or add a line."""
    return "".join(" " if unicodedata.category(ch) in ("Cc", "Zl", "Zp") else ch for ch in text)


def _line(alert: Alert) -> str:
    when = f"{alert.fired_at:%Y-%m-%d %H:%M:%S} UTC"
    return f"{when}  {one_line(alert.subject)}  {_link(alert)}".rstrip()


def render(
    delivery: AlertDelivery, tenant: Tenant, alerts: list[Alert], counts: dict[str, int]
) -> AlertMessage:
    """The message for `delivery`: its first `TICK_ALERT_DIGEST_LIST_MAX` alerts listed, the
    rest counted; `counts` = alerts per event in the whole message."""
    total = delivery.alert_count
    if total == 1 and alerts:
        subject = f"[Tick] {tenant.slug}: {one_line(alerts[0].subject)}"
    else:
        kinds = ", ".join(f"{n} {SHORT_NAMES[AlertEvent(e)]}" for e, n in sorted(counts.items()))
        subject = f"[Tick] {tenant.slug}: {total} alerts ({kinds})"
    # One line per alert whatever its subject holds (the webhook document keeps it as it is,
    # JSON-escaped).
    lines = [_line(alert) for alert in alerts]
    if total > len(alerts):
        lines.append(f"… and {total - len(alerts)} more (see {settings.TICK_PUBLIC_URL}/alerts/)")
    text = "\n".join([subject, "", *lines, "", f"Alert id: {delivery.id}"])
    document = {
        "alert_id": str(delivery.id),
        "tenant": tenant.slug,
        "count": total,
        "truncated": total > len(alerts),
        "alerts": [_alert_document(alert) for alert in alerts],
    }
    return AlertMessage(delivery.id, tenant.slug, subject, text, document)


def send_message(channel: AlertChannel, message: AlertMessage) -> None:
    """Send through the channel; raises PermanentError or TransientError."""
    if channel.kind == AlertChannel.Kind.EMAIL:
        email = EmailMessage(
            subject=message.subject,
            body=message.text,
            to=[channel.target],
            headers={ALERT_ID_HEADER: str(message.delivery_id)},
        )
        try:
            email.send()
        except smtplib.SMTPRecipientsRefused as exc:
            raise PermanentError(f"recipient refused: {exc}") from None
        except (smtplib.SMTPException, OSError) as exc:
            raise TransientError(f"e-mail not accepted: {exc}") from None
        return
    body = json.dumps(message.document, separators=(",", ":"), ensure_ascii=False).encode()
    # Signed like the webhook handler's calls (docs/webhooks.md), the alert id as message id.
    webhook_post(
        url=channel.target,
        body=body,
        headers={ALERT_ID_HEADER: str(message.delivery_id),
                 "Idempotency-Key": str(message.delivery_id)},
        tenant_id=channel.tenant_id,
        message_id=str(message.delivery_id),
    )  # fmt: skip


def alert_deliver(delivery_id: UUID, *, now: datetime | None = None) -> AlertDelivery.State | None:
    """Send one message unless it was already sent or failed, or its tenant's sends are all
    taken (then it waits for the dispatcher again); returns its state after."""
    with transaction.atomic():
        delivery = (
            AlertDelivery.objects.select_for_update()
            .select_related("channel")
            .filter(id=delivery_id)
            .first()
        )
        if delivery is None or delivery.state != AlertDelivery.State.PENDING:
            return delivery.state if delivery else None  # type: ignore[return-value]
        started = now or timezone.now()
        if _waits(delivery, started):
            return AlertDelivery.State.PENDING
        delivery.attempts += 1
        delivery.sending_until = started + timedelta(seconds=egress_deadline_s() + SENDING_MARGIN_S)
        delivery.save(update_fields=["attempts", "sending_until"])
    tenant = Tenant.objects.get(id=delivery.tenant_id)
    alerts = list(
        Alert.objects.filter(delivery=delivery).order_by("fired_at", "id")[
            : settings.TICK_ALERT_DIGEST_LIST_MAX
        ]
    )
    counts = dict(
        Alert.objects.filter(delivery=delivery)
        .values_list("event")
        .annotate(n=Count("id"))
        .values_list("event", "n")
    )
    message = render(delivery, tenant, alerts, counts)
    if delivery.channel.confirmed_at is None:
        # Grouped before its address changed; the new address has not confirmed the channel.
        error = "the channel's e-mail address has not confirmed it; nothing sent"
        return _finish(delivery, AlertDelivery.State.FAILED, error=error, now=now)
    try:
        send_message(delivery.channel, message)
    except PermanentError as exc:
        return _finish(delivery, AlertDelivery.State.FAILED, error=str(exc), now=now)
    except Exception as exc:  # noqa: BLE001 - transient or unexpected: retried, then FAILED
        if delivery.attempts >= settings.TICK_ALERT_MAX_ATTEMPTS:
            return _finish(delivery, AlertDelivery.State.FAILED, error=str(exc), now=now)
        now = now or timezone.now()
        backoff = min(MAX_BACKOFF_S, 2**delivery.attempts)
        AlertDelivery.objects.filter(id=delivery.id).update(
            published_at=None,
            available_at=now + timedelta(seconds=backoff),
            last_error=str(exc)[:1000],
            sending_until=None,
        )
        log.warning("alert message %s: attempt %d failed (%s); again in %ds",
                    delivery.id, delivery.attempts, exc, backoff)  # fmt: skip
        return AlertDelivery.State.PENDING
    return _finish(delivery, AlertDelivery.State.SENT, error="", now=now)


def _waits(delivery: AlertDelivery, started: datetime) -> bool:
    """Whether the locked `delivery` must wait instead of being sent now; then it is handed
    back to the dispatcher, no attempt spent."""
    # A second copy of a message another worker is sending now (at least once: a republish
    # or a redelivery) waits on that send's lease instead of sending beside it.
    own_lease = delivery.sending_until if (
        delivery.sending_until is not None and delivery.sending_until > started
    ) else None  # fmt: skip
    busy_until = own_lease or tenant_sends_busy_until(delivery, now=started)
    if busy_until is None:
        return False
    # `available_at` changes, so a publish confirm racing with this keeps off it.
    AlertDelivery.objects.filter(id=delivery.id).update(
        published_at=None,
        available_at=min(busy_until, started + timedelta(seconds=BUSY_RECHECK_S)),
    )
    why = "another copy is being sent" if own_lease else "its tenant's sends are taken"
    log.info("alert message %s waits: %s", delivery.id, why)
    return True


def tenant_sends_busy_until(delivery: AlertDelivery, *, now: datetime) -> datetime | None:
    """None when `delivery` may be sent now (fewer than TICK_ALERT_TENANT_SENDS other messages
    of its tenant are being sent), else when the first of those leases ends. Serialised per
    tenant by an advisory lock held to the end of the caller's transaction."""
    with connection.cursor() as cursor:
        advisory_lock(cursor, ALERT_SENDS_LOCK, delivery.tenant_id)
    cap = settings.TICK_ALERT_TENANT_SENDS
    leases = list(
        AlertDelivery.objects.filter(
            tenant_id=delivery.tenant_id, state=AlertDelivery.State.PENDING, sending_until__gt=now
        )
        .exclude(id=delivery.id)
        .order_by("sending_until")
        .values_list("sending_until", flat=True)[:cap]
    )
    return leases[0] if len(leases) >= cap else None


def _finish(
    delivery: AlertDelivery, state: AlertDelivery.State, *, error: str, now: datetime | None
) -> AlertDelivery.State:
    AlertDelivery.objects.filter(id=delivery.id, state=AlertDelivery.State.PENDING).update(
        state=state, sent_at=now or timezone.now(), last_error=error[:1000], sending_until=None
    )
    if state == AlertDelivery.State.FAILED:
        log.error("alert message %s failed: %s", delivery.id, error)
    return state
