"""A tenant's alert channels and rules: validation, the tenant door, changes (each written to
the tenant's account log), and the "send test alert" operation."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import Http404
from django.utils import timezone

from apps.occurrences.alerts.confirm import (
    confirmation_start,
    needs_confirmation,
    refuse_unconfirmed,
)
from apps.occurrences.execution.egress import url_refusal
from apps.occurrences.models import (
    LAG_EVENTS,
    RULE_EVENTS,
    Alert,
    AlertChannel,
    AlertEvent,
    AlertRule,
)
from apps.schedules.models import Schedule
from apps.tenants.addresses import email_address_errors, refuse_over_hourly_budget
from apps.tenants.models import Tenant, TenantEvent
from apps.tenants.services import log_tenant_event
from apps.tenants.text import CONTROL_CHARACTERS_MESSAGE, has_control_characters

MAX_CHANNELS_PER_TENANT = 50
MAX_RULES_PER_TENANT = 500
MAX_THRESHOLD_S = 86_400
MAX_WINDOW_MINUTES = 1_440


class AlertConfigError(ValueError):
    """Invalid channel or rule input: `fields` maps each field to its messages."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in fields.items()))
        self.fields = fields


def access_channel(*, tenant: Tenant, channel_id: uuid.UUID | str) -> AlertChannel:
    """The tenant's channel, or 404 — also for another tenant's id."""
    try:
        return AlertChannel.objects.get(tenant=tenant, id=channel_id)
    except (AlertChannel.DoesNotExist, ValueError, TypeError, ValidationError):
        raise Http404("No such alert channel.") from None


def access_rule(*, tenant: Tenant, rule_id: uuid.UUID | str) -> AlertRule:
    try:
        return AlertRule.objects.select_related("channel").get(tenant=tenant, id=rule_id)
    except (AlertRule.DoesNotExist, ValueError, TypeError, ValidationError):
        raise Http404("No such alert rule.") from None


def channel_target_errors(
    kind: str, target: str, *, extra_ports: Collection[int] = ()
) -> list[str]:
    """Why `target` cannot be used for a channel of `kind` ([] = it can). A webhook URL goes
    through the same SSRF guard as the webhook handler (again at every send)."""
    if kind == AlertChannel.Kind.EMAIL:
        return email_address_errors(target)
    if kind == AlertChannel.Kind.WEBHOOK:
        refusal = url_refusal(target, extra_ports=extra_ports)
        return [] if refusal is None else [refusal]
    return [f"Choose one of: {', '.join(AlertChannel.Kind.values)}."]


@dataclass(frozen=True)
class ChannelSpec:
    name: str
    kind: str
    target: str
    enabled: bool = True


@dataclass(frozen=True)
class RuleSpec:
    channel_id: uuid.UUID
    event: str
    schedule_id: uuid.UUID | None = None
    threshold_s: int | None = None
    window_minutes: int | None = None
    enabled: bool = True


def _check_channel(spec: ChannelSpec, tenant: Tenant) -> None:
    errors: dict[str, list[str]] = {}
    if not spec.name.strip() or len(spec.name) > 100:
        errors["name"] = ["Give a name of 1 to 100 characters."]
    elif has_control_characters(spec.name):
        errors["name"] = [CONTROL_CHARACTERS_MESSAGE]
    ports = tenant.webhook_allowed_ports  # 80/443 and these, as for the webhook handler
    if target_errors := channel_target_errors(spec.kind, spec.target, extra_ports=ports):
        errors["kind" if spec.kind not in AlertChannel.Kind.values else "target"] = target_errors
    if errors:
        raise AlertConfigError(errors)


def channel_create(*, tenant: Tenant, spec: ChannelSpec, actor: str) -> AlertChannel:
    _check_channel(spec, tenant)
    with transaction.atomic():
        Tenant.objects.select_for_update().get(id=tenant.id)  # serialises the count check
        if AlertChannel.objects.filter(tenant=tenant).count() >= MAX_CHANNELS_PER_TENANT:
            raise AlertConfigError({"name": [f"At most {MAX_CHANNELS_PER_TENANT} channels."]})
        now = timezone.now()
        channel = AlertChannel.objects.create(
            tenant=tenant, name=spec.name.strip(), kind=spec.kind, target=spec.target,
            enabled=spec.enabled, confirmed_at=None if needs_confirmation(spec.kind) else now,
        )  # fmt: skip
        _log_channel(channel, actor, "created")
        if needs_confirmation(channel.kind):
            confirmation_start(channel=channel, actor=actor, now=now)
    return channel


def _log_channel(channel: AlertChannel, actor: str, action: str) -> None:
    log_tenant_event(tenant=channel.tenant, kind=TenantEvent.Kind.ALERT_CHANNEL_CHANGED,
                     actor=actor, action=action, channel=str(channel.id),
                     name=channel.name)  # fmt: skip


def _log_rule(rule: AlertRule, actor: str, action: str, **detail: Any) -> None:
    log_tenant_event(tenant=rule.tenant, kind=TenantEvent.Kind.ALERT_RULE_CHANGED,
                     actor=actor, action=action, rule=str(rule.id), event=rule.event,
                     **detail)  # fmt: skip


def channel_update(*, channel: AlertChannel, spec: ChannelSpec, actor: str) -> AlertChannel:
    _check_channel(spec, channel.tenant)
    with transaction.atomic():
        Tenant.objects.select_for_update(no_key=True).filter(id=channel.tenant_id).exists()
        # A new address (or a channel that becomes e-mail) confirms again.
        readdressed = (spec.kind, spec.target) != (channel.kind, channel.target)
        channel.name, channel.kind, channel.target = spec.name.strip(), spec.kind, spec.target
        channel.enabled = spec.enabled
        if not needs_confirmation(channel.kind) and channel.confirmed_at is None:
            channel.confirmed_at, channel.confirmation_token_hash = timezone.now(), ""
        channel.save(update_fields=["name", "kind", "target", "enabled", "confirmed_at",
                                    "confirmation_token_hash"])  # fmt: skip
        _log_channel(channel, actor, "updated")
        if readdressed and needs_confirmation(channel.kind):
            confirmation_start(channel=channel, actor=actor, now=timezone.now())
    return channel


def channel_delete(*, channel: AlertChannel, actor: str) -> None:
    """Delete the channel with its rules, pending alerts and history."""
    with transaction.atomic():
        _log_channel(channel, actor, "deleted")
        channel.delete()


def _check_rule(tenant: Tenant, spec: RuleSpec) -> AlertChannel:
    errors: dict[str, list[str]] = {}
    channel = AlertChannel.objects.filter(tenant=tenant, id=spec.channel_id).first()
    if channel is None:
        errors["channel_id"] = ["No such alert channel."]
    if spec.event not in [str(e) for e in RULE_EVENTS]:
        errors["event"] = [f"Choose one of: {', '.join(str(e) for e in RULE_EVENTS)}."]
    if (
        spec.schedule_id is not None
        and not Schedule.objects.filter(tenant=tenant, id=spec.schedule_id).exists()
    ):
        errors["schedule_id"] = ["No such schedule."]
    is_lag = spec.event in [str(e) for e in LAG_EVENTS]
    if is_lag:
        if spec.threshold_s is not None and not 1 <= spec.threshold_s <= MAX_THRESHOLD_S:
            errors["threshold_s"] = [f"Between 1 and {MAX_THRESHOLD_S} seconds."]
        if spec.window_minutes is not None and not 1 <= spec.window_minutes <= MAX_WINDOW_MINUTES:
            errors["window_minutes"] = [f"Between 1 and {MAX_WINDOW_MINUTES} minutes."]
    else:
        for name in ("threshold_s", "window_minutes"):
            if getattr(spec, name) is not None:
                errors[name] = ["Only lag rules (start_lag, enqueue_lag) take this."]
    if errors:
        raise AlertConfigError(errors)
    assert channel is not None
    return channel


def rule_create(*, tenant: Tenant, spec: RuleSpec, actor: str) -> AlertRule:
    channel = _check_rule(tenant, spec)
    with transaction.atomic():
        Tenant.objects.select_for_update().get(id=tenant.id)
        if AlertRule.objects.filter(tenant=tenant).count() >= MAX_RULES_PER_TENANT:
            raise AlertConfigError({"event": [f"At most {MAX_RULES_PER_TENANT} rules."]})
        rule = AlertRule.objects.create(tenant=tenant, channel=channel, **_rule_fields(spec))
        _log_rule(rule, actor, "created", channel=str(channel.id))
    return rule


def _rule_fields(spec: RuleSpec) -> dict[str, Any]:
    return {
        "event": spec.event, "schedule_id": spec.schedule_id, "threshold_s": spec.threshold_s,
        "window_minutes": spec.window_minutes, "enabled": spec.enabled,
    }  # fmt: skip


def rule_update(*, rule: AlertRule, spec: RuleSpec, actor: str) -> AlertRule:
    channel = _check_rule(rule.tenant, spec)
    with transaction.atomic():
        for name, value in _rule_fields(spec).items():
            setattr(rule, name, value)
        rule.channel = channel
        rule.save()
        _log_rule(rule, actor, "updated", channel=str(channel.id))
    return rule


def rule_delete(*, rule: AlertRule, actor: str) -> None:
    with transaction.atomic():
        _log_rule(rule, actor, "deleted")
        rule.delete()


@dataclass(frozen=True)
class ConfigKind:
    """One kind of alert configuration (channels, rules) as the API and the Alerts page reach
    it: its rows, its spec, its tenant door (another tenant's id is a 404) and its services."""

    model: type[AlertChannel] | type[AlertRule]
    spec: type[ChannelSpec] | type[RuleSpec]
    access: Callable[[Tenant, Any], Any]
    create: Callable[..., Any]  # (tenant=, spec=, actor=)
    update: Callable[[Any, Any, str], Any]  # (row, spec, actor)
    delete: Callable[[Any, str], None]  # (row, actor)


CHANNELS = ConfigKind(
    model=AlertChannel,
    spec=ChannelSpec,
    access=lambda tenant, pk: access_channel(tenant=tenant, channel_id=pk),
    create=channel_create,
    update=lambda row, spec, actor: channel_update(channel=row, spec=spec, actor=actor),
    delete=lambda row, actor: channel_delete(channel=row, actor=actor),
)
RULES = ConfigKind(
    model=AlertRule,
    spec=RuleSpec,
    access=lambda tenant, pk: access_rule(tenant=tenant, rule_id=pk),
    create=rule_create,
    update=lambda row, spec, actor: rule_update(rule=row, spec=spec, actor=actor),
    delete=lambda row, actor: rule_delete(rule=row, actor=actor),
)


def send_test_alert(*, channel: AlertChannel, actor: str) -> Alert:
    """Record a test alert for the channel; the reaper sends it through the same path and
    waits as real alerts (coalescing, the channel interval). At most
    TICK_ALERT_TESTS_PER_HOUR per tenant (MailRateLimited, 429, beyond); none for an e-mail
    channel its address has not confirmed (NotConfirmed, 409)."""
    refuse_unconfirmed(channel)
    with transaction.atomic():
        # Serialises the count with the tenant's other test requests.
        Tenant.objects.select_for_update(no_key=True).filter(id=channel.tenant_id).exists()
        now = timezone.now()
        limit = settings.TICK_ALERT_TESTS_PER_HOUR
        fired_at = list(
            Alert.objects.filter(
                tenant_id=channel.tenant_id, event=AlertEvent.TEST,
                fired_at__gt=now - timedelta(hours=1),
            ).values_list("fired_at", flat=True)
        )  # fmt: skip
        refuse_over_hourly_budget(
            fired_at, limit=limit, now=now, spent=f"requested {limit} test alerts"
        )
        return Alert.objects.create(
            id=uuid.uuid4(), tenant_id=channel.tenant_id, rule=None, channel=channel,
            event=AlertEvent.TEST, subject=f"Test alert requested by {actor}",
            detail={"requested_by": actor}, fired_at=now,
        )  # fmt: skip
