from django.urls import path

from apps.occurrences import alerts_api, api, bulk_api

urlpatterns = [
    path("schedules/bulk", bulk_api.ScheduleBulk.as_view(), name="schedule-bulk"),
    path(
        "schedules/bulk/<uuid:bulk_id>",
        bulk_api.ScheduleBulkDetail.as_view(),
        name="schedule-bulk-detail",
    ),
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
]

urlpatterns += [
    path("alert-channels", alerts_api.AlertChannelListCreate.as_view(), name="alert-channel-list"),
    path(
        "alert-channels/<uuid:channel_id>",
        alerts_api.AlertChannelDetail.as_view(),
        name="alert-channel-detail",
    ),
    path(
        "alert-channels/<uuid:channel_id>/test",
        alerts_api.AlertChannelTest.as_view(),
        name="alert-channel-test",
    ),
    path(
        "alert-channels/<uuid:channel_id>/confirmation",
        alerts_api.AlertChannelConfirmation.as_view(),
        name="alert-channel-confirmation",
    ),
    path("alert-rules", alerts_api.AlertRuleListCreate.as_view(), name="alert-rule-list"),
    path(
        "alert-rules/<uuid:rule_id>", alerts_api.AlertRuleDetail.as_view(), name="alert-rule-detail"
    ),
    path("alerts", alerts_api.AlertList.as_view(), name="alert-list"),
]
