from django.urls import path

from apps.schedules import api

urlpatterns = [
    path("schedules", api.ScheduleListCreate.as_view(), name="schedule-list"),
    path("schedules/<uuid:schedule_id>", api.ScheduleDetail.as_view(), name="schedule-detail"),
]
