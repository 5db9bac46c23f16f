"""The schedule form of the web UI. It only collects text from the page: validation is the
API's (`ScheduleCreateSerializer`, which calls timerules), so a definition the API refuses is
refused here with the same field errors."""

from __future__ import annotations

import json
import zoneinfo
from functools import cache
from typing import Any

from django import forms
from django.db import models

from apps.occurrences.execution.registry import handler_names
from apps.occurrences.schedules.serializers import (
    ScheduleCreateSerializer,
    SchedulePreviewDraftSerializer,
    update_serializer,
)
from apps.schedules.labels import LabelError, parse_label_lines
from apps.schedules.models import Schedule
from apps.tenants.models import Tenant


@cache
def zone_names() -> list[str]:
    return sorted(zoneinfo.available_timezones())


# The form's units of a fixed rate's period (seconds each), largest first.
INTERVAL_UNITS = ((86_400, "days"), (3_600, "hours"), (60, "minutes"), (1, "seconds"))


def _option(
    name: str, label: str, help_text: str, words: dict[str, str] | None = None
) -> forms.ChoiceField:
    """A choice of one of the schedule's options, as the model field declares it: its choices
    (values in the API's lower case; `words` replace labels) with its default preselected."""
    field = Schedule._meta.get_field(name)
    assert isinstance(field, models.CharField) and field.choices is not None
    words = words or {}
    return forms.ChoiceField(
        label=label,
        choices=[(str(value).lower(), words.get(value, text)) for value, text in field.choices],
        initial=str(field.default).lower(),
        help_text=help_text,
    )


class ScheduleForm(forms.Form):
    name = forms.CharField(max_length=200, required=False, label="Name")
    kind = forms.ChoiceField(
        label="Kind",
        choices=[
            (Schedule.Kind.CRON.lower(), "Repeating (cron rule)"),
            (Schedule.Kind.ONE_SHOT.lower(), "Once (one-shot)"),
            (Schedule.Kind.INTERVAL.lower(), "Every N minutes/hours (fixed rate)"),
        ],
    )
    expression = forms.CharField(
        max_length=200, required=False, label="Cron expression",
        help_text="Five fields (minute hour day-of-month month day-of-week) or @hourly, "
        "@daily, @weekly, @monthly, @yearly — on the zone's wall clock. Days also as L (last), "
        "LW, 15W (nearest weekday), FRI#3, FRIL (last Friday).",
    )  # fmt: skip
    run_at = forms.CharField(
        max_length=64, required=False, label="Run at",
        help_text="2026-03-08T09:30 (the zone's local time) or with an offset or Z.",
    )  # fmt: skip
    interval_every = forms.IntegerField(
        min_value=1, required=False, label="Every",
        help_text="Fixed rate: runs this far apart in elapsed time from 'Active from' (blank "
        "= now), never moved by DST — at least a minute, at most 366 days.",
    )  # fmt: skip
    interval_unit = forms.ChoiceField(
        label="Unit", choices=[(str(size), name) for size, name in INTERVAL_UNITS],
        initial="60", required=False,
    )  # fmt: skip
    time_zone = forms.CharField(max_length=64, initial="UTC", label="Time zone (IANA)")
    handler = forms.ChoiceField(choices=(), label="Handler")
    payload = forms.CharField(
        required=False, label="Payload (JSON)", widget=forms.Textarea(attrs={"rows": 4}),
        help_text='Handed to the handler (webhook: {"url": "https://…"}).',
    )  # fmt: skip
    labels = forms.CharField(
        required=False, label="Labels", widget=forms.Textarea(attrs={"rows": 2}),
        help_text="One key=value per line (customer=42), to find and change schedules "
        "together. Keys: a-z 0-9 . _ / -.",
    )  # fmt: skip
    precision = _option(
        "precision", "Precision",
        "Strict runs at the instant; flexible may run up to the window later, spreading load.",
    )  # fmt: skip
    flexible_window_s = forms.IntegerField(
        min_value=0, max_value=300, required=False, label="Flexible window (seconds)",
        help_text="How much later than the instant a flexible run may start (0–300).",
    )  # fmt: skip
    misfire_policy = _option(
        "misfire_policy", "When a run is missed",
        "After an outage or a resume: skip missed runs, run once for all of them, or catch up "
        "each one (up to the limit).",
    )  # fmt: skip
    max_lateness_s = forms.IntegerField(
        min_value=0, required=False, label="Maximum lateness (seconds)",
        help_text="A run later than this counts as missed. Blank = 60.",
    )  # fmt: skip
    catchup_limit = forms.IntegerField(
        min_value=0, required=False, label="Catch-up limit (runs)",
        help_text="With catch up: at most this many missed runs are made up.",
    )  # fmt: skip
    overlap_policy = _option(
        "overlap_policy", "When the previous run is still going",
        "Run alongside it, skip this run, or queue one run behind it.",
    )  # fmt: skip
    dst_gap = _option(
        "dst_gap", "Local times that do not exist (spring forward)",
        "When clocks jump forward, e.g. 02:30 on the spring-forward day.",
        words={Schedule.DstGap.SKIP: "Skip them",
               Schedule.DstGap.SHIFT: "Run once at the end of the gap"},
    )  # fmt: skip
    dst_fold = _option(
        "dst_fold", "Local times that happen twice (fall back)",
        "When clocks fall back, e.g. 01:30 on the fall-back day.",
        words={Schedule.DstFold.FIRST: "Run once, at the first",
               Schedule.DstFold.BOTH: "Run at both"},
    )  # fmt: skip
    start_at = forms.CharField(
        max_length=64, required=False, label="Active from",
        help_text="No run before this instant (blank = now).",
    )  # fmt: skip
    end_at = forms.CharField(
        max_length=64, required=False, label="Active until",
        help_text="No run at or after this instant (blank = no end).",
    )  # fmt: skip
    pause_after_dead = forms.IntegerField(
        min_value=0, max_value=1000, required=False, label="Pause after consecutive DEAD runs",
        help_text="Pause the schedule by itself after this many runs in a row end DEAD "
        "(with an alert); 0 = never. Blank on a new schedule = the tenant's default.",
    )  # fmt: skip
    timeout_s = forms.IntegerField(
        min_value=1, required=False, label="Timeout (seconds)",
        help_text="Run-time limit of one attempt: at it the handler is asked to stop, and the "
        "attempt ends TIMED_OUT and is retried. Blank = the handler's default; at most the "
        "tenant's maximum.",
    )  # fmt: skip

    # The page shows these first; the rest under "Advanced" (docs/ui.md "Schedule form").
    COMMON = ("name", "kind", "expression", "run_at", "interval_every", "interval_unit",
              "time_zone", "handler", "payload", "labels")  # fmt: skip

    def common_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in self.COMMON]

    def advanced_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in self.fields if name not in self.COMMON]

    def advanced_errors(self) -> bool:
        """Open the "Advanced" section when one of its fields is refused."""
        return any(name not in self.COMMON for name in self.errors)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        period = self.initial.get("interval_s")
        if period:  # editing a fixed rate: the largest unit that divides its period
            size = next(size for size, _ in INTERVAL_UNITS if period % size == 0)
            self.initial["interval_every"] = period // size
            self.initial["interval_unit"] = str(size)
        # No handler preselected: `record` is the demo's, not for production (README). Not
        # required here: the live preview works before one is chosen, and a save without one
        # is refused by the API's serializer under the field.
        self.fields["handler"].required = False
        self.fields["handler"].choices = [("", "— choose a handler —")] + [  # type: ignore[attr-defined]
            (n, n) for n in handler_names()
        ]

    def clean_payload(self) -> Any:
        text = self.cleaned_data.get("payload") or ""
        if not text.strip():
            return {}
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise forms.ValidationError(f"Not valid JSON: {err.msg} (line {err.lineno}).") from None

    def clean_labels(self) -> dict[str, str]:
        try:
            return parse_label_lines((self.cleaned_data.get("labels") or "").splitlines())
        except LabelError as err:
            raise forms.ValidationError(err.message) from None

    def api_data(self) -> dict[str, Any]:
        """The cleaned form as the API's create body (blank optional fields omitted)."""
        data = self.cleaned_data
        body: dict[str, Any] = {
            "name": data.get("name") or "",
            "kind": data["kind"],
            "time_zone": (data.get("time_zone") or "UTC").strip(),
            "precision": data["precision"],
            "misfire_policy": data["misfire_policy"],
            "overlap_policy": data["overlap_policy"],
            "dst_gap": data["dst_gap"],
            "dst_fold": data["dst_fold"],
            "handler": data.get("handler") or "",
            "payload": data.get("payload", {}),
            "labels": data.get("labels", {}),
        }
        # Both timing fields are always sent, so an edit that switches the kind (or clears a
        # bound) replaces the saved value instead of inheriting it through the PATCH merge.
        body["interval_s"] = None
        if data["kind"] == "cron":
            body["expression"] = (data.get("expression") or "").strip()
            body["run_at"] = None
        elif data["kind"] == "interval":
            body["expression"] = ""
            body["run_at"] = None
            every = data.get("interval_every")
            unit = int(data.get("interval_unit") or 60)  # minutes unless told
            body["interval_s"] = every * unit if every else None
        else:
            body["expression"] = ""
            body["run_at"] = (data.get("run_at") or "").strip() or None
        for name in ("flexible_window_s", "max_lateness_s", "catchup_limit"):
            if data.get(name) is not None:
                body[name] = data[name]
        for name in ("start_at", "end_at"):
            body[name] = (data.get(name) or "").strip() or None
        # Always sent: a blank field clears the limit back to the handler's default.
        body["timeout_s"] = data.get("timeout_s")
        if data.get("pause_after_dead") is not None:
            body["pause_after_dead"] = data["pause_after_dead"]
        return body


# API fields the form collects under another name.
_FORM_FIELD = {"interval_s": "interval_every"}


def _merge_errors(form: forms.Form, errors: Any) -> None:
    for field, messages in dict(errors).items():
        # A payload's own field (`payload.url`) is shown on the payload box, named.
        top, _, inner = field.partition(".")
        top = _FORM_FIELD.get(top, top)
        target = top if top in form.fields else None
        for message in messages if isinstance(messages, list) else [messages]:
            form.add_error(target, f"{inner}: {message}" if inner else str(message))


def validated_create(form: ScheduleForm, *, tenant: Tenant) -> ScheduleCreateSerializer | None:
    """The API's create serializer over the form, or None with the errors on the form."""
    if not form.is_valid():
        return None
    serializer = ScheduleCreateSerializer(data=form.api_data(), context={"tenant": tenant})
    if not serializer.is_valid():
        _merge_errors(form, serializer.errors)
        return None
    return serializer


def validated_update(form: ScheduleForm, schedule: Schedule) -> ScheduleCreateSerializer | None:
    """As the API's PATCH: merged onto the saved definition, validated as on create."""
    if not form.is_valid():
        return None
    serializer = update_serializer(schedule, form.api_data())
    if not serializer.is_valid():
        _merge_errors(form, serializer.errors)
        return None
    return serializer


def validated_draft(form: ScheduleForm, *, tenant: Tenant) -> SchedulePreviewDraftSerializer | None:
    """The API's draft-preview serializer (name and handler optional)."""
    if not form.is_valid():
        return None
    body = form.api_data()
    for optional in ("name", "handler"):
        if not body[optional]:
            del body[optional]
    serializer = SchedulePreviewDraftSerializer(data=body, context={"tenant": tenant})
    if not serializer.is_valid():
        _merge_errors(form, serializer.errors)
        return None
    return serializer
