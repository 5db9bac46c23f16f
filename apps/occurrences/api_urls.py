from django.urls import path

from apps.occurrences import api

urlpatterns = [
    path("occurrences", api.OccurrenceList.as_view(), name="occurrence-list"),
    path(
        "occurrences/<uuid:occurrence_id>", api.OccurrenceDetail.as_view(), name="occurrence-detail"
    ),
]
