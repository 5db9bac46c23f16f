"""The Alerts page of the web UI (docs/ui.md, docs/alerts.md): channels, rules and the alert
history. Thin views over the same operations as /api/v1/alert-* (apps/occurrences/alerts/api.py);
every id goes through the tenant doors, so another tenant's id is a 404. Changes are admins'
only; every change is a POST that redirects back with a message."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import fields
from functools import wraps
from typing import Any, TypeVar, cast

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.core.pagination import web_page
from apps.occurrences.alerts.configure import (
    AlertConfigError,
    ChannelSpec,
    RuleSpec,
    access_channel,
    access_rule,
    channel_create,
    channel_delete,
    channel_update,
    rule_create,
    rule_delete,
    rule_update,
    send_test_alert,
)
from apps.occurrences.alerts.confirm import (
    channel_confirm,
    confirmation_for_token,
    confirmation_resend,
)
from apps.occurrences.alerts.forms import AlertChannelForm, AlertRuleForm, show_config_errors
from apps.occurrences.alerts.history import alerts_history, delivery_state
from apps.occurrences.alerts.lag import DEFAULT_THRESHOLD_S, DEFAULT_WINDOW_MINUTES
from apps.occurrences.models import LAG_EVENTS, AlertChannel, AlertRule
from apps.tenants.errors import RefusedRequest
from apps.tenants.page_lists import page_list
from apps.tenants.web import View, actor_of, admin_only, tenant_page, tick_of

HISTORY_PAGE_SIZE = 50
Result = TypeVar("Result")


def _page(
    request: HttpRequest,
    *,
    channel_form: AlertChannelForm | None = None,
    rule_form: AlertRuleForm | None = None,
    status: int = 200,
) -> HttpResponse:
    tenant = tick_of(request).tenant
    history = web_page(
        request, alerts_history(tenant=tenant), field="fired_at", size=HISTORY_PAGE_SIZE
    )
    rules = AlertRule.objects.filter(tenant=tenant).select_related("channel", "schedule")
    context: dict[str, Any] = {
        "channels": page_list(request, "channels", AlertChannel.objects.filter(tenant=tenant)),
        "rules": page_list(request, "rules", rules),
        "lag_events": [str(e) for e in LAG_EVENTS],
        "default_threshold_s": DEFAULT_THRESHOLD_S,
        "default_window_minutes": DEFAULT_WINDOW_MINUTES,
        "channel_form": channel_form or AlertChannelForm(),
        "rule_form": rule_form or AlertRuleForm(tenant=tenant),
        "history": [(alert, str(delivery_state(alert))) for alert in history.rows],
        **history.pager(),
        "errors": [history.error] if history.error else [],
        "coalesce_s": settings.TICK_ALERT_COALESCE_S,
        "interval_s": settings.TICK_ALERT_CHANNEL_INTERVAL_S,
        "nav": "alerts",
    }
    return render(request, "tick/alerts.html", context, status=status)


@tenant_page
def alerts(request: HttpRequest) -> HttpResponse:
    return _page(request)


def _admin_change(view: View) -> View:
    """A change on the Alerts page: signed in to a tenant, POST only, and admins only."""

    @tenant_page
    @require_POST
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        admin_only(request)
        return view(request, *args, **kwargs)

    return cast(View, wrapper)


def _channel(request: HttpRequest, channel_id: uuid.UUID) -> AlertChannel:
    return access_channel(tenant=tick_of(request).tenant, channel_id=channel_id)


def _rule(request: HttpRequest, rule_id: uuid.UUID) -> AlertRule:
    return access_rule(tenant=tick_of(request).tenant, rule_id=rule_id)


def _done(request: HttpRequest, message: str) -> HttpResponse:
    messages.success(request, message)
    return redirect("alerts")


def _attempt(
    request: HttpRequest,
    change: Callable[[], Result],
    *,
    refusal: type[Exception],
    failed: str,
    done: Callable[[Result], str],
) -> HttpResponse:
    """Run `change`, then back to the page with `done(result)`, or with `failed: why` when
    the change raised `refusal` (nothing changed)."""
    try:
        result = change()
    except refusal as exc:
        messages.error(request, f"{failed}: {exc}")
        return redirect("alerts")
    return _done(request, done(result))


def _toggle(
    request: HttpRequest,
    row: AlertChannel | AlertRule,
    spec_type: type[ChannelSpec | RuleSpec],
    update: Callable[[Any], AlertChannel | AlertRule],
    *,
    label: str,
    failed: str,
    disabled: str,
) -> HttpResponse:
    """Enable a disabled channel or rule, or disable an enabled one: its update service with
    the row's own values but `enabled` flipped."""
    values = {field.name: getattr(row, field.name) for field in fields(spec_type)}
    spec = spec_type(**{**values, "enabled": not row.enabled})
    return _attempt(
        request,
        lambda: update(spec),
        refusal=AlertConfigError,
        failed=failed,
        done=lambda changed: f"{label} " + ("enabled." if changed.enabled else disabled),
    )


@_admin_change
def alert_channel_add(request: HttpRequest) -> HttpResponse:
    form = AlertChannelForm(request.POST)
    if form.is_valid():
        try:
            channel = channel_create(
                tenant=tick_of(request).tenant, spec=form.to_spec(), actor=actor_of(request)
            )
        except AlertConfigError as exc:
            show_config_errors(form, exc)
        except RefusedRequest as refused:
            form.add_error(None, refused.message)
        else:
            pending = (
                f" A confirmation link was mailed to {channel.target}: nothing is sent there "
                "until it is followed."
                if channel.confirmed_at is None
                else ""
            )
            return _done(request, f"Channel “{channel.name}” added.{pending}")
    return _page(request, channel_form=form, status=400)


@_admin_change
def alert_channel_toggle(request: HttpRequest, channel_id: uuid.UUID) -> HttpResponse:
    channel = _channel(request, channel_id)
    return _toggle(
        request, channel, ChannelSpec,
        lambda spec: channel_update(channel=channel, spec=spec, actor=actor_of(request)),
        label=f"Channel “{channel.name}”", failed=f"Channel “{channel.name}” not changed",
        disabled="disabled: its rules record nothing.",
    )  # fmt: skip


@_admin_change
def alert_channel_delete(request: HttpRequest, channel_id: uuid.UUID) -> HttpResponse:
    channel = _channel(request, channel_id)
    channel_delete(channel=channel, actor=actor_of(request))
    return _done(request, f"Channel “{channel.name}” deleted, with its rules and history.")


@_admin_change
def alert_channel_test(request: HttpRequest, channel_id: uuid.UUID) -> HttpResponse:
    channel = _channel(request, channel_id)
    return _attempt(
        request,
        lambda: send_test_alert(channel=channel, actor=actor_of(request)),
        refusal=RefusedRequest,
        failed=f"No test alert for “{channel.name}”",
        done=lambda alert: (
            f"Test alert {alert.id} recorded for “{channel.name}”: the reaper "
            "sends it on its next pass. Its delivery state is in the history below."
        ),
    )


@_admin_change
def alert_channel_confirmation(request: HttpRequest, channel_id: uuid.UUID) -> HttpResponse:
    channel = _channel(request, channel_id)
    return _attempt(
        request,
        lambda: confirmation_resend(channel=channel, actor=actor_of(request)),
        refusal=RefusedRequest,
        failed=f"No confirmation mail for “{channel.name}”",
        done=lambda _: f"A new confirmation link was mailed to {channel.target}.",
    )


def alert_channel_confirm(request: HttpRequest, token: str) -> HttpResponse:
    """The link of a confirmation mail (signed in or not): shows what it confirms; the
    "Confirm" button (a POST) confirms. Mail scanners that open links confirm nothing."""
    link = confirmation_for_token(token)
    if link is None:
        return render(request, "tick/alert_channel_confirm.html", {"invalid": True}, status=404)
    if request.method == "POST":
        confirmed = channel_confirm(token)
        return render(
            request, "tick/alert_channel_confirm.html",
            {"link": link, "confirmed": confirmed is not None},
            status=200 if confirmed is not None else 404,
        )  # fmt: skip
    return render(request, "tick/alert_channel_confirm.html", {"link": link})


@_admin_change
def alert_rule_add(request: HttpRequest) -> HttpResponse:
    tenant = tick_of(request).tenant
    form = AlertRuleForm(request.POST, tenant=tenant)
    if form.is_valid():
        try:
            rule = rule_create(tenant=tenant, spec=form.to_spec(), actor=actor_of(request))
        except AlertConfigError as exc:
            show_config_errors(form, exc)
        else:
            return _done(
                request, f"Rule added: {rule.get_event_display()} → “{rule.channel.name}”."
            )
    return _page(request, rule_form=form, status=400)


@_admin_change
def alert_rule_toggle(request: HttpRequest, rule_id: uuid.UUID) -> HttpResponse:
    rule = _rule(request, rule_id)
    return _toggle(
        request, rule, RuleSpec,
        lambda spec: rule_update(rule=rule, spec=spec, actor=actor_of(request)),
        label=f"Rule {rule.get_event_display()}", failed="Rule not changed", disabled="disabled.",
    )  # fmt: skip


@_admin_change
def alert_rule_delete(request: HttpRequest, rule_id: uuid.UUID) -> HttpResponse:
    rule = _rule(request, rule_id)
    rule_delete(rule=rule, actor=actor_of(request))
    return _done(request, f"Rule {rule.get_event_display()} deleted.")
