"""Alert endpoints under /api/v1/ (docs/alerts.md): channels, rules, the test alert and the
alert history. Thin views over apps/occurrences/alerts/; every id goes through the tenant
doors (`access_channel`, `access_rule`), so another tenant's id is a 404."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import MethodNotAllowed
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.openapi import BODY, COMMON, IDEMPOTENCY_KEY, error_table
from apps.core.pagination import KeysetPagination, unknown_query_params
from apps.occurrences.alerts import configure
from apps.occurrences.alerts.configure import AlertConfigError
from apps.occurrences.alerts.confirm import confirmation_resend
from apps.occurrences.alerts.history import alerts_history
from apps.occurrences.alerts.serializers import (
    AlertChannelInputSerializer,
    AlertChannelSerializer,
    AlertListQuerySerializer,
    AlertRuleInputSerializer,
    AlertRuleSerializer,
    AlertSerializer,
    TestAlertSerializer,
    channel_as_input,
    rule_as_input,
)
from apps.tenants.authentication import principal_of
from apps.tenants.idempotency import idempotent_post

_errors = error_table(
    {
        404: "No such channel or rule in this tenant.",
        409: "The Idempotency-Key was used with another body.",
        "409-confirm": "The channel is confirmed already (or a webhook): no mail to send.",
        "409-unconfirmed": "An e-mail channel whose address has not confirmed it yet.",
        "429-mail": (
            "Per-key rate limit, or the tenant's hourly share of this kind of mail is spent; "
            "retry after `Retry-After` seconds."
        ),
    }
)


@contextmanager
def _config_errors() -> Iterator[None]:
    """The domain's field errors as a 400 in the one error shape."""
    try:
        yield
    except AlertConfigError as exc:
        raise serializers.ValidationError(exc.fields) from None


def _no_query(request: Request, known: tuple[str, ...] = ()) -> None:
    if unknown := unknown_query_params(request, known):
        raise serializers.ValidationError(unknown)


def _object_body(request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise serializers.ValidationError({"non_field_errors": ["Expected a JSON object."]})
    return request.data


@dataclass(frozen=True)
class _Kind:
    """What differs between the channel endpoints and the rule endpoints: the rest of a
    list, create, change or delete is the same (the helpers below)."""

    rows: configure.ConfigKind  # model, tenant door, services
    input: Callable[..., Any]  # the input serializer, with `to_spec()`
    output: type[serializers.BaseSerializer[Any]]
    as_input: Callable[[Any], dict[str, Any]]


_CHANNELS = _Kind(
    configure.CHANNELS, AlertChannelInputSerializer, AlertChannelSerializer, channel_as_input
)
_RULES = _Kind(configure.RULES, AlertRuleInputSerializer, AlertRuleSerializer, rule_as_input)


def _list(request: Request, kind: _Kind) -> Response:
    _no_query(request)
    rows = kind.rows.model.objects.filter(tenant=principal_of(request).tenant)
    return Response(kind.output(rows, many=True).data)


def _create(request: Request, kind: _Kind) -> Response:
    """Validate and create, once per Idempotency-Key."""
    principal = principal_of(request)

    def make() -> tuple[int, Any]:
        body = kind.input(data=request.data)
        body.is_valid(raise_exception=True)
        with _config_errors():
            row = kind.rows.create(
                tenant=principal.tenant, spec=body.to_spec(), actor=principal.actor
            )
        return status.HTTP_201_CREATED, dict(kind.output(row).data)

    return idempotent_post(request, make)


def _detail(request: Request, kind: _Kind, pk: Any) -> Response:
    row = kind.rows.access(principal_of(request).tenant, pk)
    _no_query(request)
    return Response(kind.output(row).data)


def _update(request: Request, kind: _Kind, pk: Any) -> Response:
    """The given fields over the saved ones, the whole validated as on create."""
    principal = principal_of(request)
    row = kind.rows.access(principal.tenant, pk)
    body = kind.input(data={**kind.as_input(row), **_object_body(request)})
    body.is_valid(raise_exception=True)
    with _config_errors():
        row = kind.rows.update(row, body.to_spec(), principal.actor)
    return Response(kind.output(row).data)


def _delete(request: Request, kind: _Kind, pk: Any) -> Response:
    principal = principal_of(request)
    kind.rows.delete(kind.rows.access(principal.tenant, pk), principal.actor)
    return Response(status=status.HTTP_204_NO_CONTENT)


class AlertView(APIView):
    """Base of the alert views: the tenant doors also guard refused methods and OPTIONS, so
    another tenant's id is a 404 whatever the method."""

    def _guard(self, request: Request, kwargs: dict[str, Any]) -> None:
        tenant = principal_of(request).tenant
        if "channel_id" in kwargs:
            configure.access_channel(tenant=tenant, channel_id=kwargs["channel_id"])
        if "rule_id" in kwargs:
            configure.access_rule(tenant=tenant, rule_id=kwargs["rule_id"])

    def http_method_not_allowed(  # type: ignore[override]
        self, request: Request, *args: Any, **kwargs: Any
    ) -> NoReturn:
        self._guard(request, kwargs)
        raise MethodNotAllowed(request.method or "")

    def options(self, request: Request, *args: Any, **kwargs: Any) -> Response:  # type: ignore[override]
        self._guard(request, kwargs)
        return super().options(request, *args, **kwargs)


class AlertChannelListCreate(AlertView):
    @extend_schema(responses={200: AlertChannelSerializer(many=True), **_errors(400, *COMMON)})
    def get(self, request: Request) -> Response:
        """The tenant's alert channels by name (at most 50 per tenant: not paginated)."""
        return _list(request, _CHANNELS)

    @extend_schema(
        request=AlertChannelInputSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: AlertChannelSerializer, **_errors(*BODY, 409, 401, "429-mail")},
    )
    def post(self, request: Request) -> Response:
        """Add a channel: an e-mail address, or a webhook URL that passes the same address
        guard as the webhook handler (checked again at every send). An e-mail address must
        have a public domain (no IP literal, no dotless or local host) and starts
        `confirmation: pending`: a link is mailed to it, and nothing is recorded or sent for
        the channel until it is followed (the mail counts against
        `TICK_ALERT_CONFIRMATIONS_PER_HOUR`: 429 beyond)."""
        return _create(request, _CHANNELS)


class AlertChannelDetail(AlertView):
    @extend_schema(responses={200: AlertChannelSerializer, **_errors(404, *COMMON)})
    def get(self, request: Request, channel_id: Any) -> Response:
        """One alert channel of the tenant."""
        return _detail(request, _CHANNELS, channel_id)

    @extend_schema(
        request=AlertChannelInputSerializer(partial=True),
        responses={200: AlertChannelSerializer, **_errors(*BODY, 404, 401, "429-mail")},
    )
    def patch(self, request: Request, channel_id: Any) -> Response:
        """The given fields replace the saved ones; the whole is validated as on create.
        `enabled: false` stops new alerts for the channel (its rules are kept). A new e-mail
        address is pending again until it follows the link mailed to it."""
        return _update(request, _CHANNELS, channel_id)

    @extend_schema(responses={204: None, **_errors(404, *COMMON)})
    def delete(self, request: Request, channel_id: Any) -> Response:
        """Delete the channel with its rules, its pending alerts and its history."""
        return _delete(request, _CHANNELS, channel_id)


class AlertChannelTest(AlertView):
    @extend_schema(
        request=None,
        responses={202: TestAlertSerializer, **_errors(404, "409-unconfirmed", 401, "429-mail")},
    )
    def post(self, request: Request, channel_id: Any) -> Response:
        """Record a test alert for the channel. The reaper sends it through the same path as
        real alerts, after the coalescing wait and within the channel's interval (a digest);
        follow it in GET /api/v1/alerts. At most `TICK_ALERT_TESTS_PER_HOUR` (10) per tenant
        and hour: 429 `rate_limited` with `Retry-After` beyond. An e-mail channel whose address
        has not confirmed it: 409 `channel_not_confirmed`."""
        principal = principal_of(request)
        channel = configure.access_channel(tenant=principal.tenant, channel_id=channel_id)
        alert = configure.send_test_alert(channel=channel, actor=principal.actor)
        return Response(
            {"alert_id": str(alert.id), "channel_id": str(channel.id)},
            status=status.HTTP_202_ACCEPTED,
        )


class AlertChannelConfirmation(AlertView):
    @extend_schema(
        request=None,
        responses={202: AlertChannelSerializer, **_errors(404, "409-confirm", 401, "429-mail")},
    )
    def post(self, request: Request, channel_id: Any) -> Response:
        """Mail a new confirmation link to a pending e-mail channel's address; the earlier
        link stops working. Once per channel a minute and
        `TICK_ALERT_CONFIRMATIONS_PER_HOUR` (10) per tenant and hour (creations and address
        changes included): 429 `rate_limited` with `Retry-After` beyond. A confirmed channel:
        409 `already_confirmed`."""
        principal = principal_of(request)
        channel = configure.access_channel(tenant=principal.tenant, channel_id=channel_id)
        channel = confirmation_resend(channel=channel, actor=principal.actor)
        return Response(AlertChannelSerializer(channel).data, status=status.HTTP_202_ACCEPTED)


class AlertRuleListCreate(AlertView):
    @extend_schema(responses={200: AlertRuleSerializer(many=True), **_errors(400, *COMMON)})
    def get(self, request: Request) -> Response:
        """The tenant's alert rules by event (at most 500 per tenant: not paginated)."""
        return _list(request, _RULES)

    @extend_schema(
        request=AlertRuleInputSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: AlertRuleSerializer, **_errors(*BODY, 409, *COMMON)},
    )
    def post(self, request: Request) -> Response:
        """Send one event to one channel, for every schedule or for one. `threshold_s` and
        `window_minutes` belong to lag rules only (start_lag, enqueue_lag)."""
        return _create(request, _RULES)


class AlertRuleDetail(AlertView):
    @extend_schema(responses={200: AlertRuleSerializer, **_errors(404, *COMMON)})
    def get(self, request: Request, rule_id: Any) -> Response:
        """One alert rule of the tenant."""
        return _detail(request, _RULES, rule_id)

    @extend_schema(
        request=AlertRuleInputSerializer(partial=True),
        responses={200: AlertRuleSerializer, **_errors(*BODY, 404, *COMMON)},
    )
    def patch(self, request: Request, rule_id: Any) -> Response:
        """The given fields replace the saved ones; the whole is validated as on create
        (turning a lag rule into another event needs `threshold_s` and `window_minutes` null)."""
        return _update(request, _RULES, rule_id)

    @extend_schema(responses={204: None, **_errors(404, *COMMON)})
    def delete(self, request: Request, rule_id: Any) -> Response:
        """Delete the rule with the alerts it recorded."""
        return _delete(request, _RULES, rule_id)


class AlertCursor(KeysetPagination):
    field = "fired_at"


class AlertList(AlertView):
    pagination_class = AlertCursor  # so the schema describes the paginated envelope

    @extend_schema(
        parameters=[AlertListQuerySerializer],
        responses={200: AlertSerializer(many=True), **_errors(400, *COMMON)},
    )
    def get(self, request: Request) -> Response:
        """The tenant's alert history, newest first (cursor pages), each with the state of
        the message that carries it: pending, sent or failed."""
        query = AlertListQuerySerializer(data=request.query_params)
        unknown = unknown_query_params(request, (*query.fields, *AlertCursor.query_params()))
        if not query.is_valid() or unknown:
            raise serializers.ValidationError({**query.errors, **unknown})
        queryset = alerts_history(
            tenant=principal_of(request).tenant,
            channel_id=query.validated_data.get("channel"),
            event=query.validated_data.get("event"),
        )
        paginator = AlertCursor()
        page = paginator.paginate_queryset(queryset, request, view=self)
        return paginator.get_paginated_response(AlertSerializer(page, many=True).data)
