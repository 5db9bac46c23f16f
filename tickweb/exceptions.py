"""One JSON error shape for every 4xx of the API (DRF `EXCEPTION_HANDLER`):

    {"error": {"code": "invalid", "message": "…", "fields": {"name": ["…"]}}}

`code` is stable and machine-readable, `message` is for people, `fields` (always present,
possibly empty) maps a request field (or `non_field_errors`) to its messages. Headers such
as `Retry-After` (429) and `WWW-Authenticate` (401) are kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.defaults import page_not_found
from prometheus_client import Counter
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from apps.schedules.errors import QuotaExceeded, RuleTooFrequent
from apps.tenants.errors import RefusedRequest

quota_breaches = Counter(
    "tick_quota_breaches_total", "Requests refused by a tenant quota.", ["quota"]
)

# DRF's default codes are kept (not_authenticated, authentication_failed, not_found,
# method_not_allowed, unsupported_media_type, …) except where a plainer name helps.
_RENAMED = {
    exceptions.ParseError: "malformed_json",
    exceptions.Throttled: "rate_limited",
}


def error_body(code: str, message: str, fields: dict[str, list[str]] | None = None) -> Any:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested ValidationError detail → {"a.b": ["msg", …]}."""
    if isinstance(detail, dict):
        out: dict[str, list[str]] = {}
        for key, value in detail.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            return {prefix or "non_field_errors": [str(item) for item in detail]}
        out = {}
        for index, item in enumerate(detail):
            out.update(_flatten(item, f"{prefix}.{index}" if prefix else str(index)))
        return out
    return {prefix or "non_field_errors": [str(detail)]}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, RefusedRequest):
        if isinstance(exc, QuotaExceeded | RuleTooFrequent):
            quota_breaches.labels(quota=exc.code).inc()
        fields = {exc.field: [exc.message]} if exc.field else {}
        headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
        return Response(error_body(exc.code, exc.message, fields), exc.status, headers=headers)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "Not found.")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None or not isinstance(exc, exceptions.APIException):
        return response  # a real server error: Django's 500 handling and logging apply
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        message = "Invalid input: " + "; ".join(
            f"{name}: {' '.join(messages)}" for name, messages in fields.items()
        )
        body = error_body("invalid", message, fields)
    else:
        detail = exc.detail
        text = str(detail) if not isinstance(detail, dict | list) else str(exc.default_detail)
        code = _RENAMED.get(type(exc), str(exc.default_code))
        body = error_body(code, text)
    response.data = body
    return response


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """`handler400`: Django-level refusals (before DRF runs) in the same error shape. A body
    over DATA_UPLOAD_MAX_MEMORY_SIZE is read first by middleware (request metrics), so its
    RequestDataTooBig arrives here, not in the parser: it becomes a 413."""
    if isinstance(exception, RequestDataTooBig):
        body = error_body(
            "request_too_large",
            f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes.",
        )
        return JsonResponse(body, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    return JsonResponse(error_body("bad_request", "Bad request."), status=400)


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """`handler404`: under /api/ (e.g. a malformed id no route matches) the API error shape;
    elsewhere (admin, docs) Django's page."""
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("not_found", "Not found."), status=404)
    return page_not_found(request, exception or Http404())


@csrf_exempt
def api_route_not_found(request: HttpRequest) -> HttpResponse:
    """The URL conf's last route: any /api/ path no other route matched (docs/api.md). CSRF
    exempt like the API's views (bearer keys, no cookies): a POST to an unknown path is a 404
    in the API's shape, not the CSRF failure page."""
    return JsonResponse(error_body("not_found", "Not found."), status=404)


_FAVICON = Path(__file__).resolve().parent.parent / "static" / "tick" / "favicon.ico"


def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico: the file of static/tick/, cached for a day."""
    response = HttpResponse(_FAVICON.read_bytes(), content_type="image/x-icon")
    response["Cache-Control"] = "public, max-age=86400"
    return response
