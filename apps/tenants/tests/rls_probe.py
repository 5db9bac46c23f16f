"""A URL conf for the row-level security tests: the project's routes plus probe views that
query tenant-owned tables *without* any tenant filter, as a forgotten filter would. What they
see (and what their writes to another tenant's rows do) is decided by the database alone."""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, connection, transaction
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.occurrences.pipeline.partitions import partition_name
from apps.schedules.models import Schedule
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.web import tenant_page
from tickweb.urls import urlpatterns as project_urlpatterns


def _scalar(sql: str, params: list[Any] | None = None) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        row = cursor.fetchone()
    return row[0] if row else None


def unfiltered_reads() -> dict[str, Any]:
    partition = partition_name("occurrences_occurrence", timezone.now().date())
    schedule_tenants = Schedule.objects.values_list("tenant_id", flat=True)
    return {
        "role": _scalar("SELECT current_user"),
        "schedule_tenants": sorted(str(t) for t in schedule_tenants),
        "schedules_sql": _scalar("SELECT count(*) FROM schedules_schedule"),
        "occurrences": _scalar("SELECT count(*) FROM occurrences_occurrence"),
        "partition": _scalar(f'SELECT count(*) FROM "{partition}"'),
        "tenants": sorted(Tenant.objects.values_list("slug", flat=True)),
        "api_keys": ApiKey.objects.count(),
    }


def unfiltered_writes(*, schedule_id: str, tenant_id: str) -> dict[str, Any]:
    """Rename and delete a schedule by id alone, and write an event row for a tenant."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE schedules_schedule SET name = 'hijacked' WHERE id = %s", [schedule_id]
        )
        updated = cursor.rowcount
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO tenants_tenantevent (tenant_id, kind, actor, at, detail) "
                "VALUES (%s, 'settings_changed', 'probe', now(), '{}')",
                [tenant_id],
            )
        inserted = "written"
    except DatabaseError as exc:
        inserted = f"refused: {exc}"
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "UPDATE schedules_schedule SET tenant_id = %s WHERE tenant_id <> %s",
                [tenant_id, tenant_id],
            )
            moved: Any = cursor.rowcount
    except DatabaseError as exc:
        moved = f"refused: {exc}"
    return {"updated": updated, "inserted": inserted, "moved": moved}


class ApiProbe(APIView):
    def get(self, request: Request) -> Response:
        return Response(unfiltered_reads())

    def post(self, request: Request) -> Response:
        return Response(unfiltered_writes(**request.data))


@tenant_page
def web_probe(request: HttpRequest) -> JsonResponse:
    return JsonResponse(unfiltered_reads())


@tenant_page
def reconnect_probe(request: HttpRequest) -> JsonResponse:
    connection.close()  # as an error would; the next query opens a new connection
    return JsonResponse(unfiltered_reads())


def plain_probe(request: HttpRequest) -> JsonResponse:
    return JsonResponse(unfiltered_reads())


urlpatterns = [
    path("api/v1/rls-probe", ApiProbe.as_view()),
    path("rls-probe/web/", web_probe),
    path("rls-probe/plain/", plain_probe),
    path("rls-probe/reconnect/", reconnect_probe),
    path("admin/rls-probe/", plain_probe),
    *project_urlpatterns,
]
