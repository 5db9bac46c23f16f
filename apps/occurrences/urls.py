"""Web UI routes of occurrences (mounted at "/")."""

from django.urls import include, path

from apps.occurrences import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("occurrences/", views.occurrence_list, name="occurrence-list"),
    path("occurrences/<str:occurrence_id>/", views.occurrence_detail, name="occurrence-detail"),
    path("dlq/", views.dlq, name="dlq"),
    path("dlq/replay/", views.dlq_replay, name="dlq-replay"),
    # Alert pages (apps/occurrences/alerts/urls.py), the same paths as ever.
    path("", include("apps.occurrences.alerts.urls")),
]
