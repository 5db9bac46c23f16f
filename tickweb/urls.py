from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

urlpatterns = [
    path("admin/", admin.site.urls),
    # Prometheus exposition at /metrics (Tick's own metrics: apps/occurrences/metrics.py).
    path("", include("django_prometheus.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/v1/", include("apps.schedules.api_urls")),
    path("api/v1/", include("apps.occurrences.api_urls")),
]

# Django-level 400s (e.g. a body over DATA_UPLOAD_MAX_MEMORY_SIZE → 413) in the API error shape.
handler400 = "tickweb.exceptions.bad_request"
handler404 = "tickweb.exceptions.not_found"
