"""API routes of alerts (docs/alerts.md), mounted under /api/v1/ by apps/occurrences/api_urls.py."""

from django.urls import path

from apps.occurrences.alerts import api

urlpatterns = [
    path("alert-channels", api.AlertChannelListCreate.as_view(), name="alert-channel-list"),
    path(
        "alert-channels/<uuid:channel_id>",
        api.AlertChannelDetail.as_view(),
        name="alert-channel-detail",
    ),
    path(
        "alert-channels/<uuid:channel_id>/test",
        api.AlertChannelTest.as_view(),
        name="alert-channel-test",
    ),
    path(
        "alert-channels/<uuid:channel_id>/confirmation",
        api.AlertChannelConfirmation.as_view(),
        name="alert-channel-confirmation",
    ),
    path("alert-rules", api.AlertRuleListCreate.as_view(), name="alert-rule-list"),
    path("alert-rules/<uuid:rule_id>", api.AlertRuleDetail.as_view(), name="alert-rule-detail"),
    path("alerts", api.AlertList.as_view(), name="alert-list"),
]
