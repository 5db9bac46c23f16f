from django.urls import path

from apps.schedules import api

urlpatterns = [
    path("schedules", api.ScheduleListCreate.as_view(), name="schedule-list"),
    path("schedules/preview", api.ScheduleDraftPreview.as_view(), name="schedule-draft-preview"),
    path("schedules/<uuid:schedule_id>", api.ScheduleDetail.as_view(), name="schedule-detail"),
    path(
        "schedules/<uuid:schedule_id>/preview",
        api.SchedulePreview.as_view(),
        name="schedule-preview",
    ),
]
