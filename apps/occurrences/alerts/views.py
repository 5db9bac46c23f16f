"""The Alerts page of the web UI (docs/ui.md, docs/alerts.md): channels, rules and the alert
history. Thin views over the same operations as /api/v1/alert-* (apps/occurrences/alerts/api.py);
every id goes through the tenant doors, so another tenant's id is a 404. Changes are admins'
only; every change is a POST that redirects back with a message."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import wraps
from typing import Any, TypeVar, cast

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.core.pagination import web_page
from apps.occurrences.alerts.configure import (
    CHANNELS,
    RULES,
    AlertConfigError,
    ConfigKind,
    channel_create,
    rule_create,
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


@dataclass(frozen=True)
class RowKind:
    """A kind of row the page enables, disables and deletes (channels, rules): its door and
    services (configure.py), and the words of its messages."""

    rows: ConfigKind
    label: Callable[[Any], str]
    not_changed: Callable[[Any], str]
    disabled: str
    deleted: str


CHANNEL = RowKind(
    CHANNELS,
    label=lambda channel: f"Channel “{channel.name}”",
    not_changed=lambda channel: f"Channel “{channel.name}” not changed",
    disabled="disabled: its rules record nothing.",
    deleted="deleted, with its rules and history.",
)
RULE = RowKind(
    RULES,
    label=lambda rule: f"Rule {rule.get_event_display()}",
    not_changed=lambda _: "Rule not changed",
    disabled="disabled.",
    deleted="deleted.",
)


@_admin_change
def alert_toggle(request: HttpRequest, row_id: uuid.UUID, kind: RowKind) -> HttpResponse:
    """Enable a disabled channel or rule, or disable an enabled one: its update service with
    the row's own values but `enabled` flipped (the URL conf names the kind)."""
    row = kind.rows.access(tick_of(request).tenant, row_id)
    values = {field.name: getattr(row, field.name) for field in fields(kind.rows.spec)}
    spec = kind.rows.spec(**{**values, "enabled": not row.enabled})
    return _attempt(
        request,
        lambda: kind.rows.update(row, spec, actor_of(request)),
        refusal=AlertConfigError,
        failed=kind.not_changed(row),
        done=lambda changed: (
            f"{kind.label(row)} " + ("enabled." if changed.enabled else kind.disabled)
        ),
    )


@_admin_change
def alert_delete(request: HttpRequest, row_id: uuid.UUID, kind: RowKind) -> HttpResponse:
    """Delete a channel (with its rules and history) or a rule (the URL conf names the kind)."""
    row = kind.rows.access(tick_of(request).tenant, row_id)
    kind.rows.delete(row, actor_of(request))
    return _done(request, f"{kind.label(row)} {kind.deleted}")


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


@dataclass(frozen=True)
class ChannelAction:
    """A channel's one-button action on the page that a refusal can stop (a test alert, a
    new confirmation mail): its service and the words of its messages."""

    call: Callable[[AlertChannel, str], Any]  # (channel, actor)
    failed: Callable[[AlertChannel], str]
    done: Callable[[AlertChannel, Any], str]


TEST_ALERT = ChannelAction(
    call=lambda channel, actor: send_test_alert(channel=channel, actor=actor),
    failed=lambda channel: f"No test alert for “{channel.name}”",
    done=lambda channel, alert: (
        f"Test alert {alert.id} recorded for “{channel.name}”: the reaper "
        "sends it on its next pass. Its delivery state is in the history below."
    ),
)
CONFIRMATION_RESEND = ChannelAction(
    call=lambda channel, actor: confirmation_resend(channel=channel, actor=actor),
    failed=lambda channel: f"No confirmation mail for “{channel.name}”",
    done=lambda channel, _: f"A new confirmation link was mailed to {channel.target}.",
)


@_admin_change
def alert_channel_action(
    request: HttpRequest, row_id: uuid.UUID, action: ChannelAction
) -> HttpResponse:
    """Run a channel's action (the URL conf names it), then back to the page with its words."""
    channel: AlertChannel = CHANNELS.access(tick_of(request).tenant, row_id)
    return _attempt(
        request,
        lambda: action.call(channel, actor_of(request)),
        refusal=RefusedRequest,
        failed=action.failed(channel),
        done=lambda result: action.done(channel, result),
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
