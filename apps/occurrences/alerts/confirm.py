"""E-mail channels are confirmed by their address before they receive alerts.

A new e-mail channel, or one whose address changed, is pending: rules record nothing for it
and test alerts are refused (409) until someone follows the link mailed to the address and
presses "Confirm" (a GET alone confirms nothing: mail scanners open links). Webhook channels
are confirmed when made (their receivers verify Tick's signatures instead). The link carries
a signed (SECRET_KEY) tenant id, channel id and a random secret whose sha256 the channel
keeps; a re-send replaces the secret, so only the newest link works, for
CONFIRMATION_TTL at most. Mails are counted: one re-send per channel per RESEND_GAP_S, and
TICK_ALERT_CONFIRMATIONS_PER_HOUR per tenant (MailRateLimited, 429). Every mail and every
confirmation is written to the tenant's account log.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core import signing
from django.core.mail import send_mail
from django.db import transaction
from django.template.loader import render_to_string
from django.utils import timezone

from apps.occurrences.models import AlertChannel
from apps.tenants import rls
from apps.tenants.addresses import refuse_over_hourly_budget
from apps.tenants.errors import MailRateLimited, RefusedRequest
from apps.tenants.models import Tenant, TenantEvent
from apps.tenants.services import log_tenant_event

SALT = "tick.alert-channel-confirmation"
CONFIRMATION_TTL = timedelta(days=7)
RESEND_GAP_S = 60
SENT_ACTION = "confirmation_sent"


class AlreadyConfirmed(RefusedRequest, status=409, code="already_confirmed"):
    """The channel needs no confirmation (confirmed already, or a webhook)."""


class NotConfirmed(RefusedRequest, status=409, code="channel_not_confirmed"):
    """The e-mail channel's address has not confirmed it yet: nothing is sent to it."""


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def needs_confirmation(kind: str) -> bool:
    return kind == AlertChannel.Kind.EMAIL


def _refuse_over_budget(tenant_id: uuid.UUID, now: datetime) -> None:
    limit = settings.TICK_ALERT_CONFIRMATIONS_PER_HOUR
    sent_at = list(
        TenantEvent.objects.filter(
            tenant_id=tenant_id, kind=TenantEvent.Kind.ALERT_CHANNEL_CHANGED,
            detail__action=SENT_ACTION, at__gt=now - timedelta(hours=1),
        ).values_list("at", flat=True)
    )  # fmt: skip
    refuse_over_hourly_budget(
        sent_at, limit=limit, now=now, spent=f"sent {limit} channel confirmation mails"
    )


def confirmation_start(*, channel: AlertChannel, actor: str, now: datetime) -> None:
    """Make the (saved, locked) channel pending with a new link and mail it after commit.
    The caller holds the tenant's row lock, which serialises the budget count."""
    _refuse_over_budget(channel.tenant_id, now)
    secret = secrets.token_urlsafe(32)
    channel.confirmed_at = None
    channel.confirmation_token_hash = _hash(secret)
    channel.confirmation_sent_at = now
    channel.save(update_fields=["confirmed_at", "confirmation_token_hash", "confirmation_sent_at"])
    token = signing.dumps([str(channel.tenant_id), str(channel.id), secret], salt=SALT)
    log_tenant_event(tenant=channel.tenant, kind=TenantEvent.Kind.ALERT_CHANNEL_CHANGED,
                     actor=actor, now=now, action=SENT_ACTION, channel=str(channel.id),
                     name=channel.name)  # fmt: skip
    name, tenant_name, address = channel.name, channel.tenant.name, channel.target
    transaction.on_commit(lambda: _mail(address, name, tenant_name, token))


def _mail(address: str, channel_name: str, tenant_name: str, token: str) -> None:
    base = (settings.TICK_PUBLIC_URL or "http://127.0.0.1:8000").rstrip("/")
    context = {
        "channel_name": channel_name, "tenant_name": tenant_name,
        "link": f"{base}/alerts/confirm/{token}/", "ttl_days": CONFIRMATION_TTL.days,
    }  # fmt: skip
    send_mail(
        subject=f"[Tick] Confirm alerts for {tenant_name}",
        message=render_to_string("tick/email/alert_channel_confirm.txt", context),
        from_email=None,
        recipient_list=[address],
    )


def confirmation_resend(*, channel: AlertChannel, actor: str) -> AlertChannel:
    """Mail a new link to a pending e-mail channel (the earlier link stops working)."""
    with transaction.atomic():
        Tenant.objects.select_for_update(no_key=True).filter(id=channel.tenant_id).exists()
        locked = (
            AlertChannel.objects.select_for_update().select_related("tenant").get(id=channel.id)
        )
        if not needs_confirmation(locked.kind) or locked.confirmed_at is not None:
            raise AlreadyConfirmed("This channel is confirmed: it needs no confirmation mail.")
        now = timezone.now()
        sent = locked.confirmation_sent_at
        if sent is not None and sent > now - timedelta(seconds=RESEND_GAP_S):
            wait_s = max(1, math.ceil(RESEND_GAP_S - (now - sent).total_seconds()))
            raise MailRateLimited(
                f"A confirmation mail went to this address less than {RESEND_GAP_S} s ago; "
                f"try again in {wait_s} s.",
                retry_after_s=wait_s,
            )
        confirmation_start(channel=locked, actor=actor, now=now)
    return locked


def refuse_unconfirmed(channel: AlertChannel) -> None:
    if channel.confirmed_at is None:
        raise NotConfirmed(
            f"Nothing is sent to {channel.target} until the address confirms the channel "
            "(the link in the confirmation mail; re-send it from the channel)."
        )


@dataclass(frozen=True)
class ConfirmationLink:
    channel: AlertChannel
    tenant_name: str


def confirmation_for_token(token: str) -> ConfirmationLink | None:
    """The pending channel a link confirms, or None (forged, expired, replaced, or used).

    The link is signed by Tick, so the tenant it names is entered (row-level security) for
    this one lookup by channel id and secret hash."""
    try:
        tenant_id, channel_id, secret = signing.loads(token, salt=SALT, max_age=CONFIRMATION_TTL)
        tenant_uuid, channel_uuid = uuid.UUID(tenant_id), uuid.UUID(channel_id)
    except (signing.BadSignature, ValueError, TypeError):
        return None
    rls.tenant_enter(tenant_uuid)
    channel = (
        AlertChannel.objects.select_related("tenant")
        .filter(
            id=channel_uuid,
            tenant_id=tenant_uuid,
            confirmed_at__isnull=True,
            confirmation_token_hash=_hash(str(secret)),
        )  # fmt: skip
        .first()
    )
    return None if channel is None else ConfirmationLink(channel, channel.tenant.name)


def channel_confirm(token: str) -> AlertChannel | None:
    """Confirm the channel of a valid link; None when the link does not (or no longer) work."""
    link = confirmation_for_token(token)
    if link is None:
        return None
    with transaction.atomic():
        confirmed = AlertChannel.objects.filter(
            id=link.channel.id, confirmed_at__isnull=True,
            confirmation_token_hash=link.channel.confirmation_token_hash,
        ).update(confirmed_at=timezone.now(), confirmation_token_hash="")  # fmt: skip
        if not confirmed:
            return None
        log_tenant_event(tenant=link.channel.tenant, kind=TenantEvent.Kind.ALERT_CHANNEL_CHANGED,
                         actor=f"email:{link.channel.target}", action="confirmed",
                         channel=str(link.channel.id), name=link.channel.name)  # fmt: skip
    link.channel.refresh_from_db()
    return link.channel
