"""Web UI routes of alerts (docs/ui.md), mounted at "/" by apps/occurrences/urls.py."""

from django.urls import path

from apps.occurrences.alerts import views

urlpatterns = [
    path("alerts/", views.alerts, name="alerts"),
    path("alerts/channels/", views.alert_channel_add, name="alert-channel-add"),
    path(
        "alerts/channels/<uuid:row_id>/toggle/",
        views.alert_toggle,
        {"kind": views.CHANNEL},
        name="alert-channel-toggle",
    ),
    path(
        "alerts/channels/<uuid:row_id>/delete/",
        views.alert_delete,
        {"kind": views.CHANNEL},
        name="alert-channel-delete",
    ),
    path(
        "alerts/channels/<uuid:row_id>/test/",
        views.alert_channel_action,
        {"action": views.TEST_ALERT},
        name="alert-channel-test",
    ),
    path(
        "alerts/channels/<uuid:row_id>/confirmation/",
        views.alert_channel_action,
        {"action": views.CONFIRMATION_RESEND},
        name="alert-channel-confirmation",
    ),
    path(
        "alerts/confirm/<str:token>/",
        views.alert_channel_confirm,
        name="alert-channel-confirm",
    ),  # fmt: skip
    path("alerts/rules/", views.alert_rule_add, name="alert-rule-add"),
    path(
        "alerts/rules/<uuid:row_id>/toggle/",
        views.alert_toggle,
        {"kind": views.RULE},
        name="alert-rule-toggle",
    ),
    path(
        "alerts/rules/<uuid:row_id>/delete/",
        views.alert_delete,
        {"kind": views.RULE},
        name="alert-rule-delete",
    ),
]
