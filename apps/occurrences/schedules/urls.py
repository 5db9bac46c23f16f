"""Web UI routes of schedules (mounted at "/"), served by the occurrences app: every schedule
page shows its runs (apps/occurrences/schedules/__init__.py)."""

from django.urls import path

from apps.occurrences.schedules import bulk_views, views

urlpatterns = [
    path("schedules/", views.schedule_list, name="schedule-list"),
    path("schedules/new/", views.schedule_new, name="schedule-new"),
    path("schedules/preview/", views.schedule_preview_draft, name="schedule-preview"),
    path("schedules/describe/", views.schedule_describe, name="schedule-describe"),
    path("bulk/", bulk_views.bulk_confirm, name="bulk-confirm"),
    path("bulk/<uuid:bulk_id>/", bulk_views.bulk_detail, name="bulk-detail"),
    path("schedules/<str:schedule_id>/", views.schedule_detail, name="schedule-detail"),
    path("schedules/<str:schedule_id>/edit/", views.schedule_edit, name="schedule-edit"),
    path("schedules/<str:schedule_id>/pause/", views.schedule_pause_view, name="schedule-pause"),
    path("schedules/<str:schedule_id>/resume/", views.schedule_resume_view, name="schedule-resume"),
    path("schedules/<str:schedule_id>/cancel/", views.schedule_cancel_view, name="schedule-cancel"),
    path("schedules/<str:schedule_id>/run/", views.schedule_run_view, name="schedule-run"),
    path(
        "schedules/<str:schedule_id>/backfill/",
        views.schedule_backfill_view,
        name="schedule-backfill",
    ),
    path(
        "schedules/<str:schedule_id>/backfill/preview/",
        views.schedule_backfill_preview_view,
        name="schedule-backfill-preview",
    ),
]
