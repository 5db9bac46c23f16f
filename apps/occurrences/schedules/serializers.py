"""API shapes of schedules. Validation only: state changes happen in services.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.fields import SkipField

from apps.core.fields import AnyCaseChoiceField, StrictCharField, StrictIntegerField
from apps.occurrences.execution.handlers import PayloadError
from apps.occurrences.execution.registry import handler_names, handler_spec
from apps.occurrences.manual_runs import BackfillOnly
from apps.occurrences.schedule_health import RUN_STATES, ScheduleHealth, schedules_health
from apps.occurrences.selectors import UpcomingRuns, upcoming_runs
from apps.schedules import timerules
from apps.schedules.labels import (
    DEFAULT_LABEL_LIMIT,
    LabelError,
    label_errors,
    parse_label_filter,
)
from apps.schedules.models import Schedule, ScheduleEvent
from apps.schedules.services import ScheduleSpec
from apps.tenants.text import refuse_control_characters

SERVER_OWNED = {"id", "version", "state", "next_run_at", "tenant", "shard", "created_at",
                "updated_at", "next_fires", "dead_streak", "last_run", "last_success_at",
                "success_rate"}  # fmt: skip

# The largest value a PositiveIntegerField column holds.
POSITIVE_INT_MAX = 2_147_483_647

KIND_IN = {
    "cron": Schedule.Kind.CRON,
    "one_shot": Schedule.Kind.ONE_SHOT,
    "interval": Schedule.Kind.INTERVAL,
}
KIND_OUT = {v: k for k, v in KIND_IN.items()}


def _lower_choices(choices: type[Any]) -> list[str]:
    return [value.lower() for value in choices.values]


class LowerCaseOut(serializers.CharField):
    """A stored choice (`FIRE_ONCE`) as the API writes it (`fire_once`): read-only."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(read_only=True, **kwargs)

    def to_representation(self, value: Any) -> str:
        return str(value).lower()


class ScheduleCreateSerializer(serializers.Serializer[Any]):
    """A schedule's definition. Context: `tenant` (whose limits a handler's payload is
    judged by, e.g. the webhook's port allowlist) and, on update, `current_run_at`."""

    name = StrictCharField(max_length=200, validators=[refuse_control_characters])
    kind = serializers.ChoiceField(choices=list(KIND_IN))
    expression = StrictCharField(max_length=200, required=False, allow_blank=True, default="")
    # An instant with offset ("2026-03-08T09:30:00-05:00", "...Z") or a local wall time in
    # time_zone ("2026-03-08T09:30"); resolved to UTC by timerules.resolve_one_shot.
    run_at = StrictCharField(max_length=64, required=False, allow_null=True, default=None)
    # A fixed rate's period (kind "interval"); its anchor is start_at, "now" when absent.
    interval_s = StrictIntegerField(
        required=False,
        allow_null=True,
        default=None,
        help_text=(
            f"Fixed-rate period in seconds (kind interval only): runs at start_at + k * "
            f"interval_s by elapsed time, never moved by DST. {timerules.MIN_INTERVAL_S} to "
            f"{timerules.MAX_INTERVAL_S} (366 days), and at least the tenant's min_interval_s."
        ),
    )
    time_zone = StrictCharField(max_length=64, default="UTC")
    precision = serializers.ChoiceField(
        choices=_lower_choices(Schedule.Precision), default=Schedule.Precision.STRICT.lower()
    )
    flexible_window_s = StrictIntegerField(min_value=0, max_value=300, default=0)
    misfire_policy = serializers.ChoiceField(
        choices=_lower_choices(Schedule.MisfirePolicy),
        default=Schedule.MisfirePolicy.FIRE_ONCE.lower(),
    )
    max_lateness_s = StrictIntegerField(min_value=0, max_value=7 * 86400, default=60)
    catchup_limit = StrictIntegerField(min_value=0, max_value=1000, default=0)
    overlap_policy = serializers.ChoiceField(
        choices=_lower_choices(Schedule.OverlapPolicy), default=Schedule.OverlapPolicy.ALLOW.lower()
    )
    dst_gap = serializers.ChoiceField(
        choices=Schedule.DstGap.choices, default=Schedule.DstGap.SKIP.value
    )
    dst_fold = serializers.ChoiceField(
        choices=Schedule.DstFold.choices, default=Schedule.DstFold.FIRST.value
    )
    start_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    end_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    handler = StrictCharField(max_length=100)
    payload = serializers.JSONField(required=False, default=dict)
    labels = serializers.DictField(
        child=StrictCharField(trim_whitespace=False, allow_blank=True),
        required=False,
        default=dict,
        help_text=(
            "Up to the tenant's max_labels_per_schedule (10) `key: value` pairs, e.g. "
            '{"customer": "42"}. Keys: 1 to 63 of a-z 0-9 . _ / - starting with a letter or '
            "digit; values: 1 to 100 characters. Not part of the definition: a change of "
            "labels makes no new version."
        ),
    )
    pause_after_dead = StrictIntegerField(
        min_value=0, max_value=1000, required=False, allow_null=True, default=None,
        help_text="Pause the schedule after this many consecutive DEAD occurrences (actor "
        "`tick`, an event with the reason, a `schedule_paused_failing` alert); 0 = never. "
        "null or absent on create: the tenant's default (`pause_after_dead`, 0 unless set).",
    )  # fmt: skip
    # The tenant's `max_timeout_s` is checked by the service, under the tenant lock.
    timeout_s = StrictIntegerField(
        min_value=1,
        max_value=POSITIVE_INT_MAX,
        required=False,
        allow_null=True,
        default=None,
        help_text=(
            "Run-time limit of one attempt, in seconds: at it the handler is asked to stop, "
            "and the attempt ends TIMED_OUT and is retried. 1 to the tenant's max_timeout_s "
            "(400 above it); null or absent = the handler's default."
        ),
        error_messages={
            "min_value": "A run-time limit is at least 1 s; leave it null for the handler's "
            "default.",
            "max_value": "This is more than any tenant allows.",
        },
    )

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = set(data) - set(self.fields)
            if unknown:
                owned = sorted(unknown & SERVER_OWNED)
                errors = {f: ["This field is set by the server."] for f in owned}
                errors.update({f: ["Unknown field."] for f in sorted(unknown - SERVER_OWNED)})
                raise serializers.ValidationError(errors)
        try:
            return super().to_internal_value(data)
        except serializers.ValidationError as err:
            if not isinstance(err.detail, dict) or not isinstance(data, Mapping):
                raise
            # DRF skips validate() once any field fails; the definition's rules still judge
            # the fields that did parse, so one answer names every independent mistake.
            reported: dict[str, Any] = dict(err.detail)
            parsed = self._parsed_fields(data, failed=set(reported))
            for name, messages in self._definition_errors(parsed).items():
                reported.setdefault(name, messages)
            raise serializers.ValidationError(reported) from None

    def _parsed_fields(self, data: Mapping[str, Any], *, failed: set[str]) -> dict[str, Any]:
        """The fields of `data` that parse on their own (with their `validate_<name>`)."""
        parsed: dict[str, Any] = {}
        for name, field in self.fields.items():
            if name in failed or field.read_only:
                continue
            try:
                value = field.run_validation(field.get_value(data))
                check = getattr(self, f"validate_{name}", None)
                parsed[name] = check(value) if check is not None else value
            except (serializers.ValidationError, DjangoValidationError, SkipField):
                continue
        return parsed

    def validate_handler(self, value: str) -> str:
        if value not in handler_names():
            raise serializers.ValidationError(
                f"Unknown handler {value!r}; registered: {', '.join(handler_names())}."
            )
        return value

    def validate_labels(self, value: Any) -> dict[str, str]:
        tenant = self.context.get("tenant")
        limit = tenant.max_labels_per_schedule if tenant is not None else DEFAULT_LABEL_LIMIT
        errors = label_errors(value, limit=limit)
        if "labels" in errors:  # the whole: over the quota
            raise serializers.ValidationError(errors["labels"])
        if errors:  # one pair each, answered as `labels.<key>`
            raise serializers.ValidationError({f[len("labels.") :]: m for f, m in errors.items()})
        return dict(value)

    def validate_payload(self, value: Any) -> Any:
        # Measured as stored (compact UTF-8 JSON), so the cap means the same for any client.
        cap = settings.TICK_MAX_PAYLOAD_BYTES
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
        if size > cap:
            raise serializers.ValidationError(
                f"Payload is {size} bytes as compact JSON; the limit is {cap} bytes."
            )
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        errors = self._definition_errors(attrs)
        if errors:
            raise serializers.ValidationError(errors)
        return attrs

    def _definition_errors(self, attrs: dict[str, Any]) -> dict[str, list[str]]:
        """The rules across fields, each judged when the fields it reads are in `attrs`; all
        of them report (a bad expression and a bad time zone are both named). A one-shot's
        run_at is resolved to UTC in `attrs`."""
        errors: dict[str, list[str]] = {}

        def add(field: str, message: str) -> None:
            errors.setdefault(field, []).append(message)

        if (
            KIND_IN.get(attrs.get("kind", "")) == Schedule.Kind.INTERVAL
            and attrs.get("start_at", "") is None
        ):
            # The anchor of a fixed rate: now, rounded up to the second, so the first run is
            # the anchor itself (docs/timerules.md "Fixed-rate schedules").
            now = timezone.now()
            attrs["start_at"] = now.replace(microsecond=0) + timedelta(
                seconds=1 if now.microsecond else 0
            )

        zone_ok = "time_zone" in attrs
        try:
            if zone_ok:
                timerules.validate_zone(attrs["time_zone"])
        except timerules.TimeRuleError as err:
            zone_ok = False
            add(err.field, err.message)
        try:
            if "start_at" in attrs and "end_at" in attrs:
                timerules.validate_bounds(attrs["start_at"], attrs["end_at"])
        except timerules.TimeRuleError as err:
            add(err.field, err.message)
        self._kind_errors(attrs, add, zone_ok=zone_ok)
        if (
            attrs.get("precision") == Schedule.Precision.FLEXIBLE.lower()
            and attrs.get("flexible_window_s") == 0
        ):
            add("flexible_window_s", "A flexible schedule needs a window of 1 to 300 s.")
        # Each handler's own payload rules (execution/registry.py); validate_handler has
        # already refused a name that is not there.
        spec = handler_spec(attrs["handler"]) if "handler" in attrs else None
        try:
            if spec is not None and "payload" in attrs:
                spec.validate_payload(attrs["payload"], tenant=self.context.get("tenant"))
        except PayloadError as err:
            # Named by its place in the payload (`payload.url`, `payload.headers`), like any
            # nested field of the error shape (docs/api.md).
            add("payload" if err.field == "payload" else f"payload.{err.field}", err.message)
        return errors

    def _kind_errors(
        self, attrs: dict[str, Any], add: Callable[[str, str], None], *, zone_ok: bool
    ) -> None:
        """The fields each kind takes, and its own rule: a cron expression, a one-shot's
        run_at (resolved to UTC in `attrs`), a fixed rate's interval."""
        kind = KIND_IN.get(attrs.get("kind", ""))
        if kind != Schedule.Kind.INTERVAL and attrs.get("interval_s") is not None:
            add("interval_s", "Only a fixed-rate (interval) schedule takes interval_s.")
        if kind == Schedule.Kind.INTERVAL:
            self._interval_errors(attrs, add)
        elif kind == Schedule.Kind.CRON:
            if attrs.get("run_at") is not None:
                add("run_at", "A cron schedule takes no run_at.")
            try:
                if "expression" in attrs:
                    timerules.validate_expression(attrs["expression"])
            except timerules.TimeRuleError as err:
                add(err.field, err.message)
        elif kind == Schedule.Kind.ONE_SHOT:
            if attrs.get("expression"):
                add("expression", "A one-shot schedule takes run_at, not an expression.")
            if "run_at" in attrs and attrs["run_at"] is None:
                add("run_at", "A one-shot schedule needs run_at.")
            elif "run_at" in attrs and zone_ok and "dst_gap" in attrs and "dst_fold" in attrs:
                try:
                    self._resolve_run_at(attrs)
                except timerules.TimeRuleError as err:
                    add(err.field, err.message)

    @staticmethod
    def _interval_errors(attrs: dict[str, Any], add: Callable[[str, str], None]) -> None:
        if attrs.get("expression"):
            add("expression", "A fixed-rate schedule takes interval_s, not an expression.")
        if attrs.get("run_at") is not None:
            add("run_at", "A fixed-rate schedule takes no run_at; start_at is its anchor.")
        if "interval_s" in attrs and attrs["interval_s"] is None:
            add("interval_s", "A fixed-rate schedule needs interval_s (seconds between runs).")
        elif "interval_s" in attrs:
            try:
                timerules.validate_interval(attrs["interval_s"])
            except timerules.TimeRuleError as err:
                add(err.field, err.message)

    def _resolve_run_at(self, attrs: dict[str, Any]) -> None:
        """A one-shot's run_at in UTC, refused if already later than max_lateness_s allows."""
        attrs["run_at"] = timerules.resolve_one_shot(
            attrs["run_at"],
            attrs["time_zone"],
            dst_gap=attrs["dst_gap"],
            dst_fold=attrs["dst_fold"],
        )
        if "max_lateness_s" not in attrs:
            return
        late = timezone.now() - attrs["run_at"]
        # An update that keeps a one-shot's instant is not asking to schedule the past.
        unchanged = attrs["run_at"] == self.context.get("current_run_at")
        if not unchanged and late > timedelta(seconds=attrs["max_lateness_s"]):
            raise timerules.TimeRuleError(
                "run_at",
                f"run_at is {int(late.total_seconds())} s in the past, beyond "
                f"max_lateness_s ({attrs['max_lateness_s']}).",
            )

    def to_spec(self) -> ScheduleSpec:
        data = self.validated_data
        return ScheduleSpec(
            name=data["name"],
            kind=KIND_IN[data["kind"]],
            expression=data["expression"],
            run_at=data["run_at"],
            interval_s=data["interval_s"],
            time_zone=data["time_zone"],
            dst_gap=data["dst_gap"],
            dst_fold=data["dst_fold"],
            start_at=data["start_at"],
            end_at=data["end_at"],
            precision=data["precision"].upper(),
            flexible_window_s=data["flexible_window_s"],
            misfire_policy=data["misfire_policy"].upper(),
            max_lateness_s=data["max_lateness_s"],
            catchup_limit=data["catchup_limit"],
            overlap_policy=data["overlap_policy"].upper(),
            handler=data["handler"],
            payload=data["payload"],
            timeout_s=data["timeout_s"],
            labels=data["labels"],
            pause_after_dead=data["pause_after_dead"],
        )


class LastRunSerializer(serializers.Serializer[dict[str, Any]]):
    """A schedule's last run: its occurrence state and when (finished, or due while
    unfinished)."""

    state = serializers.ChoiceField(choices=[s.value for s in RUN_STATES])
    at = serializers.DateTimeField()


class ScheduleListSerializer(serializers.ListSerializer[Schedule]):
    """Many schedules: their shown next runs and next fires are read in one query for all of
    them."""

    def to_representation(self, data: Any) -> list[Any]:
        items = list(data.all() if hasattr(data, "all") else data)
        if isinstance(self.child, ScheduleSerializer):
            now = timezone.now()
            self.child.upcoming = upcoming_runs(items, now=now)
            # One query for the page (apps/occurrences/schedule_health.py); a page is one
            # tenant's.
            self.child.health = schedules_health(items, now=now)
        return super().to_representation(items)


class ScheduleSerializer(serializers.ModelSerializer[Schedule]):
    # Shown next runs and next fires by schedule id, set by ScheduleListSerializer for a
    # whole page.
    upcoming: dict[uuid.UUID, UpcomingRuns] | None = None
    # Health by schedule id, set the same way.
    health: dict[uuid.UUID, ScheduleHealth] | None = None

    kind = serializers.SerializerMethodField()
    precision = LowerCaseOut()
    misfire_policy = LowerCaseOut()
    overlap_policy = LowerCaseOut()
    next_run_at = serializers.SerializerMethodField()
    next_fires = serializers.SerializerMethodField()
    last_run = serializers.SerializerMethodField()
    last_success_at = serializers.SerializerMethodField()
    success_rate = serializers.SerializerMethodField()

    class Meta:
        model = Schedule
        list_serializer_class = ScheduleListSerializer
        fields = [
            "id", "name", "kind", "expression", "run_at", "interval_s", "time_zone", "dst_gap",
            "dst_fold",
            "start_at", "end_at", "precision", "flexible_window_s", "misfire_policy",
            "max_lateness_s", "catchup_limit", "overlap_policy", "handler", "payload",
            "timeout_s", "labels", "pause_after_dead", "dead_streak", "version", "state",
            "next_run_at", "created_at", "updated_at", "next_fires", "last_run",
            "last_success_at", "success_rate",
        ]  # fmt: skip
        read_only_fields = fields
        extra_kwargs = {
            "timeout_s": {"help_text": "Run-time limit of one attempt, in seconds; null = the "
                          "handler's default."},
            "interval_s": {"help_text": "Fixed-rate period in seconds (kind interval); null "
                           "for the other kinds. start_at is its anchor."},
        }  # fmt: skip

    def get_kind(self, obj: Schedule) -> str:
        return KIND_OUT[Schedule.Kind(obj.kind)]

    @extend_schema_field(
        serializers.DateTimeField(
            allow_null=True,
            help_text=(
                "The earliest instant of the schedule not yet run: its earliest pending "
                "occurrence (scheduled, enqueued or waiting to retry) or the first instant not "
                "yet materialized, whichever comes first. null unless the schedule is active."
            ),
        )
    )
    def get_next_run_at(self, obj: Schedule) -> str | None:
        # The shown value, not the stored cursor of the same name (docs/api.md).
        value = self._upcoming(obj).next_run_at
        return None if value is None else serializers.DateTimeField().to_representation(value)

    def _upcoming(self, obj: Schedule) -> UpcomingRuns:
        if self.upcoming is None or obj.id not in self.upcoming:
            self.upcoming = {**(self.upcoming or {}), **upcoming_runs([obj], now=timezone.now())}
        return self.upcoming[obj.id]

    def _health(self, obj: Schedule) -> ScheduleHealth:
        if self.health is None or obj.id not in self.health:
            self.health = {**(self.health or {}), **schedules_health([obj], now=timezone.now())}
        return self.health[obj.id]

    @extend_schema_field(LastRunSerializer(allow_null=True))
    def get_last_run(self, obj: Schedule) -> dict[str, Any] | None:
        """The latest occurrence of the last 7 days that ran or should have (finished,
        running or waiting to retry); null if none."""
        health = self._health(obj)
        if health.last_run_state is None or health.last_run_at is None:
            return None
        return {
            "state": health.last_run_state.value,
            "at": timerules.instant_text(health.last_run_at),
        }

    @extend_schema_field(
        serializers.DateTimeField(
            allow_null=True,
            help_text="When the latest successful occurrence of the last 7 days finished; null "
            "if none.",
        )
    )
    def get_last_success_at(self, obj: Schedule) -> str | None:
        at = self._health(obj).last_success_at
        return None if at is None else timerules.instant_text(at)

    @extend_schema_field(
        serializers.FloatField(
            allow_null=True, min_value=0, max_value=1,
            help_text="Share (0..1) of the latest finished occurrences (at most 20, last 7 "
            "days; SUCCEEDED, DEAD or MISSED) that succeeded; null if none finished.",
        )
    )  # fmt: skip
    def get_success_rate(self, obj: Schedule) -> float | None:
        rate = self._health(obj).success_rate
        return None if rate is None else round(rate, 4)

    def get_next_fires(self, obj: Schedule) -> list[str]:
        """The next five instants (UTC) the schedule runs, from its next run: its pending
        occurrences that have not started, then the rule's instants not yet materialized,
        before end_at. A retry waiting is not listed (it shows as next_run_at), nor a run
        now or a backfill. Empty unless the schedule is active."""
        return [timerules.instant_text(at) for at in self._upcoming(obj).fires]


class PreviewQuerySerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField(min_value=1, max_value=100, default=10)


class SchedulePreviewDraftSerializer(ScheduleCreateSerializer):
    """A draft's timing fields, validated exactly as on create; name and handler optional."""

    name = StrictCharField(max_length=200, required=False, default="draft")
    handler = StrictCharField(max_length=100, required=False, default="noop")
    count = StrictIntegerField(min_value=1, max_value=100, default=10)


class PreviewEntrySerializer(serializers.Serializer[Any]):
    at_utc = serializers.DateTimeField()
    local_time = serializers.CharField()
    local_wall = serializers.CharField()
    utc_offset = serializers.CharField()
    abbreviation = serializers.CharField()
    note = serializers.CharField(allow_null=True)
    notes = serializers.ListField(child=serializers.CharField())


def schedule_as_input(schedule: Schedule) -> dict[str, Any]:
    """A saved schedule in create-input form: the base a PATCH is merged onto."""

    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "name": schedule.name,
        "kind": KIND_OUT[Schedule.Kind(schedule.kind)],
        "expression": schedule.expression,
        "run_at": iso(schedule.run_at),
        "interval_s": schedule.interval_s,
        "time_zone": schedule.time_zone,
        "precision": schedule.precision.lower(),
        "flexible_window_s": schedule.flexible_window_s,
        "misfire_policy": schedule.misfire_policy.lower(),
        "max_lateness_s": schedule.max_lateness_s,
        "catchup_limit": schedule.catchup_limit,
        "overlap_policy": schedule.overlap_policy.lower(),
        "dst_gap": schedule.dst_gap,
        "dst_fold": schedule.dst_fold,
        "start_at": iso(schedule.start_at),
        "end_at": iso(schedule.end_at),
        "handler": schedule.handler,
        "payload": schedule.payload,
        "timeout_s": schedule.timeout_s,
        "labels": dict(schedule.labels),
        "pause_after_dead": schedule.pause_after_dead,
    }


def update_serializer(schedule: Schedule, data: Any) -> ScheduleCreateSerializer:
    """PATCH semantics: the given fields replace the saved ones (a payload is replaced, not
    deep-merged), then the whole definition is validated exactly as on create. Unknown and
    server-owned fields are refused by name."""
    if not isinstance(data, dict):
        raise serializers.ValidationError({"non_field_errors": ["Expected a JSON object."]})
    merged = {**schedule_as_input(schedule), **data}
    return ScheduleCreateSerializer(
        data=merged, context={"current_run_at": schedule.run_at, "tenant": schedule.tenant}
    )


class ScheduleListQuerySerializer(serializers.Serializer[Any]):
    state = AnyCaseChoiceField(choices=Schedule.State.choices, required=False)
    kind = AnyCaseChoiceField(choices=list(KIND_IN), required=False)
    # Taken as sent (no trimming): the lengths the schema states are the lengths checked.
    handler = serializers.CharField(max_length=100, required=False, trim_whitespace=False)
    # Case-insensitive substring of the name, served by a trigram index; two characters or
    # fewer would match nearly everything and make the index useless.
    q = serializers.CharField(min_length=3, max_length=200, required=False, trim_whitespace=False)

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        # `label` is a Field attribute (its display name): declared here, not on the class.
        fields["label"] = serializers.ListField(
            child=serializers.CharField(max_length=200, trim_whitespace=False),
            required=False,
            help_text="`key=value`; repeat the parameter for several labels (all must match).",
        )
        return fields

    def validate_label(self, value: list[str]) -> list[tuple[str, str]]:
        try:
            return [parse_label_filter(text) for text in value]
        except LabelError as err:
            raise serializers.ValidationError(err.message) from None

    def validate_state(self, value: str) -> Schedule.State:
        return Schedule.State(value)

    def validate_kind(self, value: str) -> Schedule.Kind:
        return KIND_IN[value]


class NotRecalledSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    state = serializers.CharField()
    scheduled_for = serializers.DateTimeField()
    schedule_version = serializers.IntegerField()


# The schedule changes that answer with a receipt (apps/occurrences/schedule_changes.py).
_RECEIPT_ACTIONS = (
    ScheduleEvent.Kind.UPDATED,
    ScheduleEvent.Kind.PAUSED,
    ScheduleEvent.Kind.RESUMED,
    ScheduleEvent.Kind.CANCELED,
)


class RestoredSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    scheduled_for = serializers.DateTimeField()


class ReceiptSerializer(serializers.Serializer[Any]):
    action = serializers.ChoiceField(choices=[str(kind) for kind in _RECEIPT_ACTIONS])
    at = serializers.DateTimeField()
    version = serializers.IntegerField(help_text="The schedule's version after the change.")
    invalidated = serializers.ListField(
        child=serializers.UUIDField(),
        help_text=(
            "Occurrences recalled before publication (their outbox rows removed before their "
            "publish time): never delivered, never run."
        ),
    )
    dropped_at_claim = serializers.ListField(
        child=serializers.UUIDField(),
        help_text=(
            "Occurrences recalled at or after their publish time: the relay may already have "
            "published them (published, not yet recorded). If their message is delivered, "
            "the worker's claim drops it: delivered at most once, never run."
        ),
    )
    invalidated_state = serializers.CharField(
        allow_null=True,
        help_text=(
            "The state of the recalled occurrences (`invalidated` and `dropped_at_claim`): "
            "SUPERSEDED (update) or CANCELED (pause, cancel)."
        ),
    )
    not_recalled = NotRecalledSerializer(
        many=True,
        help_text=(
            "Occurrences already enqueued, running or finished that could not be recalled. "
            "An enqueued one still runs (an update's new version starts after it), unless "
            "the schedule is canceled."
        ),
    )
    restored = RestoredSerializer(
        many=True,
        help_text=(
            "Resume: occurrences the last pause canceled whose instant is still ahead, "
            "scheduled again with the same ids (each runs once). Empty for other changes."
        ),
    )


class LifecycleResponseSerializer(serializers.Serializer[Any]):
    schedule = ScheduleSerializer()
    receipt = ReceiptSerializer()


# --------------------------------------------------------------------------------------------
# Run now and backfill (apps/occurrences/manual_runs.py)
# --------------------------------------------------------------------------------------------


def _refuse_unknown(serializer: serializers.Serializer[Any], data: Any) -> None:
    if isinstance(data, Mapping):
        unknown = sorted(set(data) - set(serializer.fields))
        if unknown:
            raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})


@extend_schema_field(OpenApiTypes.DATETIME)
class InstantField(StrictCharField):
    """An RFC 3339 instant with its offset (`2026-12-03T06:00:00Z`), as an aware UTC datetime."""

    def to_internal_value(self, data: Any) -> Any:
        text = super().to_internal_value(data)
        try:
            value = parse_datetime(text)
        except ValueError:
            value = None
        if value is None or value.tzinfo is None:
            raise serializers.ValidationError(
                "Must be an RFC 3339 instant with its offset, like 2026-12-03T06:00:00Z."
            )
        return value.astimezone(UTC)


class RunNowRequestSerializer(serializers.Serializer[Any]):
    request_id = StrictCharField(
        min_length=1,
        max_length=255,
        required=False,
        help_text=(
            "Names this request: a retry with the same request id (or `Idempotency-Key` "
            "header) answers the first receipt and runs nothing more. Absent: a fresh one."
        ),
    )

    def to_internal_value(self, data: Any) -> Any:
        _refuse_unknown(self, data)
        return super().to_internal_value(data)

    def validate_request_id(self, value: str) -> str:
        if not (value.isascii() and value.isprintable()):
            raise serializers.ValidationError("Use 1 to 255 printable ASCII characters.")
        return value


class BackfillRequestSerializer(serializers.Serializer[Any]):
    only = AnyCaseChoiceField(
        choices=BackfillOnly.choices,
        default=BackfillOnly.MISSED,
        help_text=(
            "missed: instants with no run, or that ended MISSED, SKIPPED_OVERLAP or CANCELED; "
            "failed: instants that ended DEAD; all: every instant (not those still in flight)."
        ),
    )
    dry_run = serializers.BooleanField(
        default=False,
        help_text="Only count what would run (the preview); nothing is written.",
    )

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        # `from` is a Python keyword: declared here instead of as a class attribute.
        fields["from"] = InstantField(help_text="Start of the range (inclusive).")
        fields["to"] = InstantField(help_text="End of the range (exclusive), not in the future.")
        return fields

    def to_internal_value(self, data: Any) -> Any:
        _refuse_unknown(self, data)
        if isinstance(data, Mapping) and not isinstance(data.get("dry_run", False), bool):
            raise serializers.ValidationError({"dry_run": ["Must be true or false."]})
        return super().to_internal_value(data)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        now = timezone.now()
        start, end = attrs["from"], attrs["to"]
        errors: dict[str, list[str]] = {}
        oldest = now - timedelta(days=settings.TICK_RETENTION_DAYS)
        if start < oldest:
            errors["from"] = [
                f"Occurrences are kept {settings.TICK_RETENTION_DAYS} days: from must be on "
                f"or after {timerules.instant_text(oldest)}."
            ]
        if end > now:
            errors["to"] = ["Must not be in the future: backfill runs instants that passed."]
        elif end <= start:
            errors["to"] = ["Must be after from."]
        if errors:
            raise serializers.ValidationError(errors)
        attrs["only"] = BackfillOnly(attrs["only"])
        return attrs


class RunNowReceiptSerializer(serializers.Serializer[Any]):
    action = serializers.CharField(help_text="Always `run_now`.")
    at = serializers.DateTimeField()
    version = serializers.IntegerField(help_text="The schedule's version the run belongs to.")
    occurrence = serializers.UUIDField(
        help_text="The run's occurrence (derived from the request id)."
    )
    scheduled_for = serializers.DateTimeField()
    lane = serializers.CharField()
    state = serializers.CharField(
        help_text="SCHEDULED (due now), SKIPPED_OVERLAP (see `reason`), or its state by now "
        "when `replayed`."
    )
    request_id = serializers.CharField()
    replayed = serializers.BooleanField(
        help_text="True: this request id had already run; nothing new was created."
    )
    reason = serializers.CharField(help_text="Why it will not run; empty when it runs.")


class RunNowResponseSerializer(serializers.Serializer[Any]):
    schedule = ScheduleSerializer()
    receipt = RunNowReceiptSerializer()


class BackfillReceiptSerializer(serializers.Serializer[Any]):
    action = serializers.CharField(help_text="Always `backfilled`.")
    at = serializers.DateTimeField()
    version = serializers.IntegerField()
    only = serializers.CharField()
    dry_run = serializers.BooleanField()
    lane = serializers.CharField()
    instants = serializers.IntegerField(help_text="The rule's instants in [from, to).")
    queued = serializers.IntegerField(
        help_text="Instants queued now (dry run: that would be queued)."
    )
    already_done = serializers.IntegerField(help_text="Instants an earlier backfill already ran.")
    skipped = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Instants not run, by what became of them: missed, failed, succeeded "
        "(not selected by `only`), in_flight (may still run), not_materialized (the "
        "materializer has not decided them yet).",
    )
    first = serializers.DateTimeField(allow_null=True, help_text="Earliest instant queued.")
    last = serializers.DateTimeField(allow_null=True, help_text="Latest instant queued.")
    occurrences = serializers.ListField(
        child=serializers.UUIDField(),
        help_text="Ids of the queued occurrences (at most 1000; deterministic per instant).",
    )

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        fields["from"] = serializers.DateTimeField(source="start", help_text="As requested.")
        fields["to"] = serializers.DateTimeField(source="end", help_text="As requested.")
        return fields


class BackfillResponseSerializer(serializers.Serializer[Any]):
    schedule = ScheduleSerializer()
    receipt = BackfillReceiptSerializer()
