"""Probe views for the pooler leak tests (test_pooler_leak.py): the row-level-security probes
of rls_probe.py, read twice with pauses in between (another request runs meanwhile on the
same server connection), and requests that fail in the middle of a transaction."""

from __future__ import annotations

import time
from typing import Any

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.tenants.tests.rls_probe import _scalar, unfiltered_reads
from apps.tenants.tests.rls_probe import urlpatterns as rls_urlpatterns
from apps.tenants.web import tenant_page

PAUSE_S = 0.02


def paused_reads() -> dict[str, Any]:
    """Reads in two autocommit transactions and one atomic block, a pause before each."""
    time.sleep(PAUSE_S)
    first = unfiltered_reads()
    time.sleep(PAUSE_S)
    with transaction.atomic():
        second = unfiltered_reads()
        server_pid = _scalar("SELECT pg_backend_pid()")
    return {**first, "again": second, "server_pid": server_pid}


def failing_transaction() -> None:
    """Reads the tenant's rows, then fails inside the same transaction (a division by zero)."""
    time.sleep(PAUSE_S)
    with transaction.atomic():
        unfiltered_reads()
        time.sleep(PAUSE_S)
        _scalar("SELECT 1 / 0")


def failing_statement() -> None:
    """Fails in an autocommit statement of its own."""
    time.sleep(PAUSE_S)
    _scalar("SELECT 1 / (SELECT count(*) - count(*) FROM schedules_schedule)")


class ApiReads(APIView):
    def get(self, request: Request) -> Response:
        return Response(paused_reads())


class ApiFails(APIView):
    def post(self, request: Request) -> Response:
        if request.data.get("in") == "statement":
            failing_statement()
        failing_transaction()
        return Response({})  # not reached


@tenant_page
def web_reads(request: HttpRequest) -> JsonResponse:
    return JsonResponse(paused_reads())


@tenant_page
def web_fails(request: HttpRequest) -> JsonResponse:
    if request.GET.get("in") == "statement":
        failing_statement()
    failing_transaction()
    return JsonResponse({})  # not reached


urlpatterns = [
    path("api/v1/pooler-probe", ApiReads.as_view()),
    path("api/v1/pooler-probe/fail", ApiFails.as_view()),
    path("pooler-probe/web/", web_reads),
    path("pooler-probe/web/fail/", web_fails),
    *rls_urlpatterns,
]
