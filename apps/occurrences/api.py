"""Occurrence endpoints under /api/v1/: list (filtered, keyset-paginated) and detail."""

from __future__ import annotations

import uuid
from typing import Any

from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

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
