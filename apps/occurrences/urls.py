"""Web UI routes of occurrences (mounted at "/")."""

from django.urls import path

from apps.occurrences import alerts_views, bulk_views, views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("occurrences/", views.occurrence_list, name="occurrence-list"),
    path("occurrences/<str:occurrence_id>/", views.occurrence_detail, name="occurrence-detail"),
    path("bulk/", bulk_views.bulk_confirm, name="bulk-confirm"),
    path("bulk/<uuid:bulk_id>/", bulk_views.bulk_detail, name="bulk-detail"),
    path("dlq/", views.dlq, name="dlq"),
    path("dlq/replay/", views.dlq_replay, name="dlq-replay"),
    path("alerts/", alerts_views.alerts, name="alerts"),
    path("alerts/channels/", alerts_views.alert_channel_add, name="alert-channel-add"),
    path(
        "alerts/channels/<uuid:channel_id>/toggle/",
        alerts_views.alert_channel_toggle,
        name="alert-channel-toggle",
    ),
    path(
        "alerts/channels/<uuid:channel_id>/delete/",
        alerts_views.alert_channel_delete,
        name="alert-channel-delete",
    ),
    path(
        "alerts/channels/<uuid:channel_id>/test/",
        alerts_views.alert_channel_test,
        name="alert-channel-test",
    ),
    path(
        "alerts/channels/<uuid:channel_id>/confirmation/",
        alerts_views.alert_channel_confirmation,
        name="alert-channel-confirmation",
    ),
    path(
        "alerts/confirm/<str:token>/",
        alerts_views.alert_channel_confirm,
        name="alert-channel-confirm",
    ),  # fmt: skip
    path("alerts/rules/", alerts_views.alert_rule_add, name="alert-rule-add"),
    path(
        "alerts/rules/<uuid:rule_id>/toggle/",
        alerts_views.alert_rule_toggle,
        name="alert-rule-toggle",
    ),
    path(
        "alerts/rules/<uuid:rule_id>/delete/",
        alerts_views.alert_rule_delete,
        name="alert-rule-delete",
    ),
]
