"""Occurrence endpoints under /api/v1/: list (filtered, keyset-paginated), detail, the DLQ
(`occurrences/dead` = the list with state=DEAD; detail shows every attempt with its error),
replay of one or many DEAD occurrences, and cancel."""

from __future__ import annotations

import uuid
from typing import Any

from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.occurrences.execution.attempts import CancelOutcome, occurrence_cancel, occurrences_replay
from apps.occurrences.models import Occurrence
from apps.occurrences.selectors import access_occurrence, occurrences_for
from apps.occurrences.serializers import OccurrenceDetailSerializer, OccurrenceSerializer
from apps.tenants.authentication import TenantPrincipal


class OccurrenceCursor(CursorPagination):
    ordering = ("-scheduled_for", "-id")
    page_size = 50
    max_page_size = 200
    page_size_query_param = "page_size"


def _tenant(request: Request) -> Any:
    assert isinstance(request.user, TenantPrincipal)
    return request.user.tenant


class OccurrenceList(APIView):
    forced_state: str | None = None
    pagination_class = OccurrenceCursor  # so the schema describes the paginated envelope

    @extend_schema(
        parameters=[
            OpenApiParameter("schedule", str, description="schedule id"),
            OpenApiParameter("state", str, enum=list(Occurrence.State.values)),
            OpenApiParameter("from", str, description="scheduled_for >= (ISO 8601)"),
            OpenApiParameter("to", str, description="scheduled_for < (ISO 8601)"),
        ],
        responses=OccurrenceSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        queryset = occurrences_for(tenant=_tenant(request))
        if self.forced_state:
            queryset = queryset.filter(state=self.forced_state)
        params = request.query_params
        errors: dict[str, list[str]] = {}
        if params.get("schedule"):
            try:
                queryset = queryset.filter(schedule_id=uuid.UUID(params["schedule"]))
            except ValueError:
                errors["schedule"] = ["Must be a schedule id (UUID)."]
        if params.get("state"):
            if params["state"] not in Occurrence.State.values:
                errors["state"] = [f"Must be one of {', '.join(Occurrence.State.values)}."]
            queryset = queryset.filter(state=params["state"])
        for name, lookup in (("from", "scheduled_for__gte"), ("to", "scheduled_for__lt")):
            if params.get(name):
                value = parse_datetime(params[name])
                if value is None or value.tzinfo is None:
                    errors[name] = ["An ISO 8601 instant with an offset is required."]
                else:
                    queryset = queryset.filter(**{lookup: value})
        if errors:
            raise ValidationError(errors)
        paginator = OccurrenceCursor()
        page = paginator.paginate_queryset(queryset, request, view=self)
        return paginator.get_paginated_response(OccurrenceSerializer(page, many=True).data)


class OccurrenceDetail(APIView):
    @extend_schema(responses=OccurrenceDetailSerializer)
    def get(self, request: Request, occurrence_id: Any) -> Response:
        occurrence = access_occurrence(tenant=_tenant(request), occurrence_id=occurrence_id)
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

    forced_state = Occurrence.State.DEAD


class OccurrenceReplay(APIView):
    @extend_schema(
        operation_id="occurrences_replay_one",
        request=None,
        responses={200: OccurrenceDetailSerializer},
    )
    def post(self, request: Request, occurrence_id: Any) -> Response:
        tenant = _tenant(request)
        occurrence = access_occurrence(tenant=tenant, occurrence_id=occurrence_id)
        result = occurrences_replay(tenant_id=tenant.id, occurrence_ids=[occurrence.id])
        if not result.replayed:
            state = result.not_dead.get(occurrence.id, occurrence.state)
            raise NotDead(f"Only DEAD occurrences can be replayed; this one is {state}.")
        occurrence = access_occurrence(tenant=tenant, occurrence_id=occurrence.id)
        return Response(OccurrenceDetailSerializer(occurrence).data)


class BulkReplayRequest(serializers.Serializer[Any]):
    ids = serializers.ListField(
        child=serializers.UUIDField(), min_length=1, max_length=500, allow_empty=False
    )


class BulkReplayResponse(serializers.Serializer[Any]):
    replayed = serializers.ListField(child=serializers.UUIDField())
    not_dead = serializers.DictField(child=serializers.CharField())
    not_found = serializers.ListField(child=serializers.UUIDField())


class OccurrenceBulkReplay(APIView):
    @extend_schema(
        operation_id="occurrences_replay_many",
        request=BulkReplayRequest,
        responses={200: BulkReplayResponse},
    )
    def post(self, request: Request) -> Response:
        body = BulkReplayRequest(data=request.data)
        body.is_valid(raise_exception=True)
        result = occurrences_replay(
            tenant_id=_tenant(request).id, occurrence_ids=body.validated_data["ids"]
        )
        # Another tenant's id is reported exactly like a missing one.
        return Response(
            {
                "replayed": [str(i) for i in result.replayed],
                "not_dead": {str(k): v for k, v in result.not_dead.items()},
                "not_found": [str(i) for i in result.not_found],
            }
        )


class OccurrenceCancel(APIView):
    @extend_schema(request=None, responses={200: None, 202: None, 409: None})
    def post(self, request: Request, occurrence_id: Any) -> Response:
        tenant = _tenant(request)
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
