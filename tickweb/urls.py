from csp.decorators import csp_update
from django.contrib import admin
from django.contrib.contenttypes.views import shortcut
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from apps.occurrences.admin import admin_urlpatterns as occurrence_admin_urls
from apps.occurrences.observability import health, metrics_access
from tickweb.csp import SWAGGER_INLINE_STYLE_TEMPLATES, style_hash_update
from tickweb.exceptions import api_route_not_found, favicon


def view_on_site(request: HttpRequest, content_type_id: str, object_id: str) -> HttpResponse:
    """The admin's "view on site" redirect, with a malformed id a 404: Django's own view
    lets the ValidationError of a non-UUID primary key through as a 500."""
    try:
        return shortcut(request, content_type_id, object_id)
    except ValidationError:
        raise Http404("No such object.") from None


urlpatterns = [
    # Before the admin's own route of the same path (see view_on_site).
    path("admin/r/<path:content_type_id>/<path:object_id>/", view_on_site),
    # Support staff's occurrence browser (composite keys: no ModelAdmin), before the admin.
    path("admin/", include(occurrence_admin_urls)),
    path("admin/", admin.site.urls),
    # Prometheus exposition at /metrics, for the allowed networks or the bearer token only
    # (apps/occurrences/observability/metrics_access.py).
    path("metrics", metrics_access.metrics_view, name="metrics"),
    # Liveness and readiness of the web process (apps/occurrences/observability/health.py).
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # Swagger UI: its init script is a separate request (the split view) and its one fixed
    # inline style block is allowed by hash; its icons are data: images (tickweb/csp.py).
    path(
        "api/docs/",
        csp_update({**style_hash_update(*SWAGGER_INLINE_STYLE_TEMPLATES), "img-src": ["data:"]})(
            SpectacularSwaggerSplitView.as_view(url_name="api-schema")
        ),
        name="api-docs",
    ),
    path("api/v1/", include("apps.occurrences.schedules.api_urls")),
    path("api/v1/", include("apps.occurrences.api_urls")),
    path("api/v1/", include("apps.tenants.api_urls")),
    # Tenant web UI (docs/ui.md): log in, dashboard, schedules, occurrences, DLQ, keys, members.
    path("", include("apps.tenants.urls")),
    path("", include("apps.occurrences.schedules.urls")),
    path("", include("apps.occurrences.urls")),
    # Browsers ask every site for /favicon.ico, the admin's pages included.
    path("favicon.ico", favicon, name="favicon"),
    # Last: an /api/ path no route matched answers the API's JSON error shape even with
    # DJANGO_DEBUG=1 (Django's debug 404 page bypasses handler404).
    re_path(r"^api/", api_route_not_found, name="api-not-found"),
]

# Django-level 400s (e.g. a body over DATA_UPLOAD_MAX_MEMORY_SIZE → 413) in the API error shape.
handler400 = "tickweb.exceptions.bad_request"
handler404 = "tickweb.exceptions.not_found"
