from __future__ import annotations

from typing import Any

from rest_framework import serializers

from apps.occurrences.models import Attempt, Occurrence
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
