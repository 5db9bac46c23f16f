"""Web forms of alerts (docs/alerts.md). They parse what a browser sends; every rule of a
channel or a rule is the domain's (apps/occurrences/alerts/configure.py), whose field errors
`show_config_errors` puts under the fields they name."""

from __future__ import annotations

import uuid
from typing import Any

from django import forms

from apps.occurrences.alerts.configure import (
    MAX_THRESHOLD_S,
    MAX_WINDOW_MINUTES,
    AlertConfigError,
    ChannelSpec,
    RuleSpec,
)
from apps.occurrences.alerts.lag import DEFAULT_THRESHOLD_S, DEFAULT_WINDOW_MINUTES
from apps.occurrences.models import RULE_EVENTS, AlertChannel
from apps.schedules.models import Schedule
from apps.tenants.models import Tenant

# The rule form's schedule list; a tenant with more sets the others' rules through the API.
SCHEDULE_CHOICES_MAX = 300


class AlertChannelForm(forms.Form):
    name = forms.CharField(max_length=100, label="Name")
    kind = forms.ChoiceField(choices=AlertChannel.Kind.choices, label="Kind")
    target = forms.CharField(
        max_length=2048,
        label="Target",
        help_text="E-mail: an address. Webhook: an http(s) URL on a public address.",
    )

    def to_spec(self) -> ChannelSpec:
        data = self.cleaned_data
        return ChannelSpec(name=data["name"], kind=data["kind"], target=data["target"])


class AlertRuleForm(forms.Form):
    event = forms.ChoiceField(choices=[(str(e), e.label) for e in RULE_EVENTS], label="Event")
    channel_id = forms.ChoiceField(label="Channel")
    schedule_id = forms.ChoiceField(label="Schedule", required=False)
    threshold_s = forms.IntegerField(
        label="Threshold (s)", required=False, min_value=1, max_value=MAX_THRESHOLD_S,
        help_text=f"Lag events only; blank = {DEFAULT_THRESHOLD_S} s.",
    )  # fmt: skip
    window_minutes = forms.IntegerField(
        label="Window (min)", required=False, min_value=1, max_value=MAX_WINDOW_MINUTES,
        help_text="Lag events only: above the threshold in every one of these minutes; "
        f"blank = {DEFAULT_WINDOW_MINUTES}.",
    )  # fmt: skip

    def __init__(self, *args: Any, tenant: Tenant, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        channels = AlertChannel.objects.filter(tenant=tenant).values_list("id", "name", "kind")
        self.fields["channel_id"].choices = [  # type: ignore[attr-defined]
            (str(i), f"{name} ({kind})") for i, name, kind in channels
        ]
        schedules = (
            Schedule.objects.filter(tenant=tenant)
            .exclude(state=Schedule.State.CANCELED)
            .order_by("name", "id")
            .values_list("id", "name")[:SCHEDULE_CHOICES_MAX]
        )
        self.fields["schedule_id"].choices = [  # type: ignore[attr-defined]
            ("", "Every schedule"),
            *((str(i), name) for i, name in schedules),
        ]

    def to_spec(self) -> RuleSpec:
        data = self.cleaned_data
        return RuleSpec(
            channel_id=uuid.UUID(data["channel_id"]), event=data["event"],
            schedule_id=uuid.UUID(data["schedule_id"]) if data["schedule_id"] else None,
            threshold_s=data["threshold_s"],
            window_minutes=data["window_minutes"],
        )  # fmt: skip


def show_config_errors(form: forms.Form, exc: AlertConfigError) -> None:
    """Each of the domain's field errors under its field (or above the form)."""
    for name, messages in exc.fields.items():
        for message in messages:
            form.add_error(name if name in form.fields else None, message)
