from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.fields import AnyCaseChoiceField, StrictCharField, StrictIntegerField
from apps.occurrences.alerts.configure import (
    MAX_THRESHOLD_S,
    MAX_WINDOW_MINUTES,
    ChannelSpec,
    RuleSpec,
)
from apps.occurrences.alerts.history import delivery_state
from apps.occurrences.models import (
    RULE_EVENTS,
    Alert,
    AlertChannel,
    AlertDelivery,
    AlertEvent,
    AlertRule,
    Attempt,
    Occurrence,
)
from apps.occurrences.selectors import attempts_of, enqueue_lag_s, start_lag_s


class AttemptSerializer(serializers.ModelSerializer[Attempt]):
    class Meta:
        model = Attempt
        fields = [
            "attempt_no", "worker_id", "started_at", "finished_at", "lease_expires_at",
            "outcome", "error_class", "error_message",
        ]  # fmt: skip
        read_only_fields = fields


class OccurrenceSerializer(serializers.ModelSerializer[Occurrence]):
    schedule_id = serializers.UUIDField(read_only=True)
    lag_s = serializers.SerializerMethodField()
    start_lag_s = serializers.SerializerMethodField(
        help_text="How late the handler started, in seconds: the first attempt's started_at "
        "minus scheduled_for (strict and catchup lanes) or minus available_at (flexible "
        "lane). Includes the queue wait and any quota or overlap delay; retries are not "
        "counted. null until the first attempt starts. A run asked for (origin manual or "
        "backfill) counts from its available_at, when it was asked for."
    )

    class Meta:
        model = Occurrence
        fields = [
            "id", "schedule_id", "schedule_version", "scheduled_for", "available_at",
            "enqueued_at", "lag_s", "start_lag_s", "state", "lane", "attempt_count", "created_at",
            "finished_at", "last_enqueued_at", "redelivery_count", "last_redelivered_at",
            "origin", "requested_by",
        ]  # fmt: skip
        read_only_fields = fields

    def get_lag_s(self, obj: Occurrence) -> float | None:
        """enqueued_at - scheduled_for (flexible: - available_at), seconds."""
        return enqueue_lag_s(obj)

    def get_start_lag_s(self, obj: Occurrence) -> float | None:
        return start_lag_s(obj)


class OccurrenceDetailSerializer(OccurrenceSerializer):
    attempts = serializers.SerializerMethodField()

    class Meta(OccurrenceSerializer.Meta):
        fields = [
            *OccurrenceSerializer.Meta.fields, "attempt_base", "deadline_at",
            "cancel_requested_at", "attempts",
        ]  # fmt: skip
        read_only_fields = fields

    def get_attempts(self, obj: Occurrence) -> list[dict[str, Any]]:
        return list(AttemptSerializer(attempts_of(obj), many=True).data)


# --- alerts (docs/alerts.md) ----------------------------------------------------------------


RULE_EVENT_CHOICES = [(str(e), e.label) for e in RULE_EVENTS]


class StrictBooleanField(serializers.BooleanField):
    """A JSON true or false, never "yes", 1 or "false"."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class _ClosedInput(serializers.Serializer[Any]):
    """A request body: every key is a field of the serializer; others are named in the 400."""

    server_owned = frozenset({"id", "tenant", "created_at", "last_sent_at"})

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = set(data) - set(self.fields)
            if unknown:
                errors = {
                    name: ["This field is set by the server."]
                    if name in self.server_owned
                    else ["Unknown field."]
                    for name in sorted(unknown)
                }
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


class AlertChannelSerializer(serializers.ModelSerializer[AlertChannel]):
    last_sent_at = serializers.DateTimeField(
        read_only=True,
        help_text="When the channel last got a message (at most one per "
        "TICK_ALERT_CHANNEL_INTERVAL_S); null if never.",
    )

    confirmation = serializers.ChoiceField(
        choices=["pending", "confirmed"],
        read_only=True,
        help_text="pending: an e-mail channel whose address has not followed the link mailed "
        "to it yet; nothing is recorded or sent for it. Webhook channels are confirmed.",
    )

    class Meta:
        model = AlertChannel
        fields = ["id", "name", "kind", "target", "enabled", "confirmation", "created_at",
                  "last_sent_at"]  # fmt: skip
        read_only_fields = fields


class AlertChannelInputSerializer(_ClosedInput):
    name = StrictCharField(max_length=100)
    kind = serializers.ChoiceField(choices=AlertChannel.Kind.choices)
    target = StrictCharField(
        max_length=2048,
        help_text="email: an e-mail address; webhook: an http(s) URL on a public address "
        "(private, loopback and link-local addresses are refused unless allow-listed).",
    )
    enabled = StrictBooleanField(required=False, default=True)

    def to_spec(self) -> ChannelSpec:
        data = self.validated_data
        return ChannelSpec(
            name=data["name"], kind=data["kind"], target=data["target"], enabled=data["enabled"]
        )


def channel_as_input(channel: AlertChannel) -> dict[str, Any]:
    return {
        "name": channel.name, "kind": channel.kind, "target": channel.target,
        "enabled": channel.enabled,
    }  # fmt: skip


class AlertRuleSerializer(serializers.ModelSerializer[AlertRule]):
    channel_id = serializers.UUIDField(read_only=True)
    schedule_id = serializers.UUIDField(
        read_only=True, allow_null=True, help_text="null: every schedule of the tenant."
    )

    class Meta:
        model = AlertRule
        fields = [
            "id", "channel_id", "event", "schedule_id", "threshold_s", "window_minutes",
            "enabled", "created_at",
        ]  # fmt: skip
        read_only_fields = fields


class AlertRuleInputSerializer(_ClosedInput):
    channel_id = serializers.UUIDField()
    event = serializers.ChoiceField(choices=RULE_EVENT_CHOICES)
    schedule_id = serializers.UUIDField(
        required=False, allow_null=True, default=None,
        help_text="Only this schedule's events; null or absent: every schedule.",
    )  # fmt: skip
    threshold_s = StrictIntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=MAX_THRESHOLD_S,
        help_text="Lag rules only: fire when the p95 lag is above this many seconds "
        "(null: 60).",
    )  # fmt: skip
    window_minutes = StrictIntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=MAX_WINDOW_MINUTES,
        help_text="Lag rules only: ... in every one of this many whole minutes (null: 5).",
    )  # fmt: skip
    enabled = StrictBooleanField(required=False, default=True)

    def to_spec(self) -> RuleSpec:
        data = self.validated_data
        return RuleSpec(
            channel_id=data["channel_id"], event=data["event"], schedule_id=data["schedule_id"],
            threshold_s=data["threshold_s"], window_minutes=data["window_minutes"],
            enabled=data["enabled"],
        )  # fmt: skip


def rule_as_input(rule: AlertRule) -> dict[str, Any]:
    return {
        "channel_id": str(rule.channel_id), "event": rule.event,
        "schedule_id": str(rule.schedule_id) if rule.schedule_id else None,
        "threshold_s": rule.threshold_s, "window_minutes": rule.window_minutes,
        "enabled": rule.enabled,
    }  # fmt: skip


class AlertChannelRefSerializer(serializers.ModelSerializer[AlertChannel]):
    class Meta:
        model = AlertChannel
        fields = ["id", "name", "kind"]
        read_only_fields = fields


class AlertSerializer(serializers.ModelSerializer[Alert]):
    channel = AlertChannelRefSerializer(read_only=True)
    rule_id = serializers.UUIDField(read_only=True, allow_null=True)
    delivery_id = serializers.UUIDField(
        read_only=True, allow_null=True,
        help_text="The message that carries the alert: the `Tick-Alert-Id` its receiver saw. "
        "null until the alert is grouped into a message.",
    )  # fmt: skip
    delivery_state = serializers.SerializerMethodField(
        help_text="pending (not sent yet, retries included), sent, or failed (every attempt "
        "failed, or the channel refused it for good)."
    )
    sent_at = serializers.DateTimeField(
        source="delivery.sent_at", read_only=True, allow_null=True,
        help_text="When its message was sent (or given up as failed); null while pending.",
    )  # fmt: skip
    delivery_error = serializers.SerializerMethodField(
        help_text="The last send error of its message; empty if none."
    )

    class Meta:
        model = Alert
        fields = [
            "id", "event", "subject", "schedule_id", "occurrence_id", "detail", "fired_at",
            "channel", "rule_id", "delivery_id", "delivery_state", "sent_at", "delivery_error",
        ]  # fmt: skip
        read_only_fields = fields

    @extend_schema_field(
        serializers.ChoiceField(choices=AlertDelivery.State.choices)  # type: ignore[arg-type]
    )
    def get_delivery_state(self, obj: Alert) -> str:
        return str(delivery_state(obj))

    def get_delivery_error(self, obj: Alert) -> str:
        return obj.delivery.last_error if obj.delivery else ""


class AlertListQuerySerializer(serializers.Serializer[Any]):
    channel = serializers.UUIDField(required=False, help_text="Only this channel's alerts.")
    event = AnyCaseChoiceField(
        choices=AlertEvent.choices, required=False, help_text="any letter case"
    )


class TestAlertSerializer(serializers.Serializer[Any]):
    alert_id = serializers.UUIDField()
    channel_id = serializers.UUIDField()
