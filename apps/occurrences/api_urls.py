from django.urls import include, path

from apps.occurrences import api

urlpatterns = [
    path("occurrences", api.OccurrenceList.as_view(), name="occurrence-list"),
    path("occurrences/dead", api.DeadOccurrenceList.as_view(), name="occurrence-dead"),
    path("occurrences/replay", api.OccurrenceBulkReplay.as_view(), name="occurrence-replay-bulk"),
    path(
        "occurrences/<uuid:occurrence_id>/replay",
        api.OccurrenceReplay.as_view(),
        name="occurrence-replay",
    ),
    path(
        "occurrences/<uuid:occurrence_id>/cancel",
        api.OccurrenceCancel.as_view(),
        name="occurrence-cancel",
    ),
    path(
        "occurrences/<uuid:occurrence_id>", api.OccurrenceDetail.as_view(), name="occurrence-detail"
    ),
    # The alert API (apps/occurrences/alerts/api_urls.py), the same paths as ever.
    path("", include("apps.occurrences.alerts.api_urls")),
]
