"""Web UI routes of alerts (docs/ui.md), mounted at "/" by apps/occurrences/urls.py."""

from django.urls import path

from apps.occurrences.alerts import views

urlpatterns = [
    path("alerts/", views.alerts, name="alerts"),
    path("alerts/channels/", views.alert_channel_add, name="alert-channel-add"),
    path(
        "alerts/channels/<uuid:channel_id>/toggle/",
        views.alert_channel_toggle,
        name="alert-channel-toggle",
    ),
    path(
        "alerts/channels/<uuid:channel_id>/delete/",
        views.alert_channel_delete,
        name="alert-channel-delete",
    ),
    path(
        "alerts/channels/<uuid:channel_id>/test/",
        views.alert_channel_test,
        name="alert-channel-test",
    ),
    path(
        "alerts/channels/<uuid:channel_id>/confirmation/",
        views.alert_channel_confirmation,
        name="alert-channel-confirmation",
    ),
    path(
        "alerts/confirm/<str:token>/",
        views.alert_channel_confirm,
        name="alert-channel-confirm",
    ),  # fmt: skip
    path("alerts/rules/", views.alert_rule_add, name="alert-rule-add"),
    path(
        "alerts/rules/<uuid:rule_id>/toggle/",
        views.alert_rule_toggle,
        name="alert-rule-toggle",
    ),
    path(
        "alerts/rules/<uuid:rule_id>/delete/",
        views.alert_rule_delete,
        name="alert-rule-delete",
    ),
]
