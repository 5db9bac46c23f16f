from django.urls import path

from apps.occurrences.schedules import api, bulk_api

urlpatterns = [
    path("schedules", api.ScheduleListCreate.as_view(), name="schedule-list"),
    path("schedules/preview", api.ScheduleDraftPreview.as_view(), name="schedule-draft-preview"),
    path("schedules/bulk", bulk_api.ScheduleBulk.as_view(), name="schedule-bulk"),
    path(
        "schedules/bulk/<uuid:bulk_id>",
        bulk_api.ScheduleBulkDetail.as_view(),
        name="schedule-bulk-detail",
    ),
    path("schedules/<uuid:schedule_id>", api.ScheduleDetail.as_view(), name="schedule-detail"),
    path(
        "schedules/<uuid:schedule_id>/preview",
        api.SchedulePreview.as_view(),
        name="schedule-preview",
    ),
    path("schedules/<uuid:schedule_id>/pause", api.SchedulePause.as_view(), name="schedule-pause"),
    path(
        "schedules/<uuid:schedule_id>/resume", api.ScheduleResume.as_view(), name="schedule-resume"
    ),
    path(
        "schedules/<uuid:schedule_id>/cancel", api.ScheduleCancel.as_view(), name="schedule-cancel"
    ),
    path("schedules/<uuid:schedule_id>/run", api.ScheduleRunNow.as_view(), name="schedule-run"),
    path(
        "schedules/<uuid:schedule_id>/backfill",
        api.ScheduleBackfill.as_view(),
        name="schedule-backfill",
    ),
]
