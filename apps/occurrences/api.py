"""Occurrence endpoints under /api/v1/: list (filtered, keyset-paginated), detail, the DLQ
(`occurrences/dead` = the list with state=DEAD; detail shows every attempt with its error),
replay of one or many DEAD occurrences, and cancel."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.openapi import COMMON, done_or_accepted, error_table
from apps.core.pagination import KeysetPagination, unknown_query_params
from apps.occurrences.execution.cancel import CancelOutcome, occurrence_cancel
from apps.occurrences.execution.replay import occurrences_replay
from apps.occurrences.models import Occurrence
from apps.occurrences.selectors import (
    OCCURRENCE_FILTER_PARAMS,
    OccurrenceFilterError,
    access_occurrence,
    occurrences_filtered,
    parse_occurrence_filter,
)
from apps.occurrences.serializers import OccurrenceDetailSerializer, OccurrenceSerializer
from apps.tenants.authentication import principal_of

_errors = error_table(
    {
        "400-filter": "A bad filter or cursor, or an unknown parameter.",
        404: "No such occurrence in this tenant.",
        409: "Conflict with the occurrence's state.",
    }
)


class OccurrenceCursor(KeysetPagination):
    field = "scheduled_for"


class OccurrenceList(APIView):
    only_state: Occurrence.State | None = None
    pagination_class = OccurrenceCursor  # so the schema describes the paginated envelope

    @extend_schema(
        parameters=[
            OpenApiParameter("schedule", OpenApiTypes.UUID, description="schedule id"),
            OpenApiParameter(
                "state", str, enum=list(Occurrence.State.values), description="any letter case"
            ),
            OpenApiParameter(
                "from", OpenApiTypes.DATETIME, description="scheduled_for >= (RFC 3339)"
            ),
            OpenApiParameter("to", OpenApiTypes.DATETIME, description="scheduled_for < (RFC 3339)"),
        ],
        responses={
            200: OccurrenceSerializer(many=True),
            **_errors("400-filter", *COMMON),
        },
    )
    def get(self, request: Request) -> Response:
        errors = unknown_query_params(
            request, (*OCCURRENCE_FILTER_PARAMS, *OccurrenceCursor.query_params())
        )
        try:
            filters = parse_occurrence_filter(request.query_params)
        except OccurrenceFilterError as err:
            errors = {**{name: [message] for name, message in err.errors.items()}, **errors}
        if errors:
            raise ValidationError(errors)
        queryset = occurrences_filtered(
            tenant=principal_of(request).tenant, filters=filters, only_state=self.only_state
        )
        paginator = OccurrenceCursor()
        page = paginator.paginate_queryset(queryset, request, view=self)
        return paginator.get_paginated_response(OccurrenceSerializer(page, many=True).data)


class OccurrenceDetail(APIView):
    @extend_schema(responses={200: OccurrenceDetailSerializer, **_errors(404, *COMMON)})
    def get(self, request: Request, occurrence_id: Any) -> Response:
        occurrence = access_occurrence(
            tenant=principal_of(request).tenant, occurrence_id=occurrence_id
        )
        return Response(OccurrenceDetailSerializer(occurrence).data)


class NotDead(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "not_dead"
    default_detail = "Only DEAD occurrences can be replayed."


class AlreadyFinished(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "already_finished"
    default_detail = "The occurrence already finished."


class DeadOccurrenceList(OccurrenceList):
    """The DLQ: DEAD occurrences, newest first (same filters as the list)."""

    only_state = Occurrence.State.DEAD


class OccurrenceReplay(APIView):
    @extend_schema(
        operation_id="occurrences_replay_one",
        request=None,
        responses={200: OccurrenceDetailSerializer, **_errors(404, 409, *COMMON)},
    )
    def post(self, request: Request, occurrence_id: Any) -> Response:
        tenant = principal_of(request).tenant
        occurrence = access_occurrence(tenant=tenant, occurrence_id=occurrence_id)
        result = occurrences_replay(tenant_id=tenant.id, occurrence_ids=[occurrence.id])
        if not result.replayed:
            state = result.not_dead.get(occurrence.id, occurrence.state)
            raise NotDead(f"Only DEAD occurrences can be replayed; this one is {state}.")
        occurrence = access_occurrence(tenant=tenant, occurrence_id=occurrence.id)
        return Response(OccurrenceDetailSerializer(occurrence).data)


class StrictUUIDField(serializers.UUIDField):
    """A UUID written as a string: DRF's own field also takes a JSON integer (and so `true`
    and `false`) as the UUID of that number, which no client means."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid", value=data)
        return super().to_internal_value(data)


class BulkReplayRequest(serializers.Serializer[Any]):
    ids = serializers.ListField(
        child=StrictUUIDField(), min_length=1, max_length=500, allow_empty=False
    )


class BulkReplayResponse(serializers.Serializer[Any]):
    replayed = serializers.ListField(child=serializers.UUIDField())
    not_dead = serializers.DictField(child=serializers.CharField())
    not_found = serializers.ListField(child=serializers.UUIDField())


class OccurrenceBulkReplay(APIView):
    @extend_schema(
        operation_id="occurrences_replay_many",
        request=BulkReplayRequest,
        responses={200: BulkReplayResponse, **_errors(400, 413, 415, *COMMON)},
    )
    def post(self, request: Request) -> Response:
        body = BulkReplayRequest(data=request.data)
        body.is_valid(raise_exception=True)
        result = occurrences_replay(
            tenant_id=principal_of(request).tenant.id, occurrence_ids=body.validated_data["ids"]
        )
        # Another tenant's id is reported exactly like a missing one.
        return Response(
            {
                "replayed": [str(i) for i in result.replayed],
                "not_dead": {str(k): v for k, v in result.not_dead.items()},
                "not_found": [str(i) for i in result.not_found],
            }
        )


class CancelResponse(serializers.Serializer[Any]):
    state = serializers.ChoiceField(
        choices=[Occurrence.State.CANCELED.value, Occurrence.State.RUNNING.value]
    )
    cancel_requested = serializers.BooleanField(
        required=False, help_text="Running: the handler is asked to stop (202)."
    )


class OccurrenceCancel(APIView):
    @extend_schema(
        request=None,
        responses={
            **done_or_accepted(CancelResponse, CancelResponse),
            **_errors(404, 409, *COMMON),
        },
    )
    def post(self, request: Request, occurrence_id: Any) -> Response:
        tenant = principal_of(request).tenant
        occurrence = access_occurrence(tenant=tenant, occurrence_id=occurrence_id)
        outcome = occurrence_cancel(tenant_id=tenant.id, occurrence_id=occurrence.id)
        if outcome == CancelOutcome.CANCELED:
            return Response({"state": Occurrence.State.CANCELED})
        if outcome == CancelOutcome.REQUESTED:
            return Response(
                {"state": Occurrence.State.RUNNING, "cancel_requested": True},
                status=status.HTTP_202_ACCEPTED,
            )
        occurrence = access_occurrence(tenant=tenant, occurrence_id=occurrence.id)
        raise AlreadyFinished(f"The occurrence already finished ({occurrence.state}).")
