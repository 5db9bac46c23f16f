"""Schedule endpoints under /api/v1/: thin views over selectors and services."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.schedules.selectors import access_schedule, schedules_for
from apps.schedules.serializers import ScheduleCreateSerializer, ScheduleSerializer
from apps.schedules.services import schedule_create
from apps.tenants.authentication import TenantPrincipal


class ScheduleCursor(CursorPagination):
    # Keyset pagination on (created_at, id) via schedule_tenant_list_idx: constant cost per
    # page at any table size, unlike OFFSET.
    ordering = ("-created_at", "-id")
    page_size = 50
    max_page_size = 200
    page_size_query_param = "page_size"


def _principal(request: Request) -> TenantPrincipal:
    assert isinstance(request.user, TenantPrincipal)
    return request.user


class ScheduleListCreate(APIView):
    @extend_schema(responses=ScheduleSerializer(many=True))
    def get(self, request: Request) -> Response:
        principal = _principal(request)
        queryset = schedules_for(tenant=principal.tenant)
        state = request.query_params.get("state")
        if state:
            queryset = queryset.filter(state=state.upper())
        paginator = ScheduleCursor()
        page = paginator.paginate_queryset(queryset, request, view=self)
        return paginator.get_paginated_response(ScheduleSerializer(page, many=True).data)

    @extend_schema(request=ScheduleCreateSerializer, responses={201: ScheduleSerializer})
    def post(self, request: Request) -> Response:
        principal = _principal(request)
        serializer = ScheduleCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        schedule = schedule_create(
            tenant=principal.tenant, spec=serializer.to_spec(), actor=principal.actor
        )
        return Response(ScheduleSerializer(schedule).data, status=status.HTTP_201_CREATED)


class ScheduleDetail(APIView):
    @extend_schema(responses=ScheduleSerializer)
    def get(self, request: Request, schedule_id: Any) -> Response:
        schedule = access_schedule(tenant=_principal(request).tenant, schedule_id=schedule_id)
        return Response(ScheduleSerializer(schedule).data)
