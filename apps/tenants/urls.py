"""Web UI routes of tenants: log in/out, password change and reset, account sessions, tenant
switch, API keys, webhook signing, members and invitations, activity."""

from django.contrib.auth import views as auth_views
from django.urls import path

from apps.tenants import views

urlpatterns = [
    path("login/", views.Login.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("account/", views.account, name="account"),
    path("account/sessions/revoke/", views.account_sessions_revoke, name="account-sessions-revoke"),
    path("account/password/", views.PasswordChange.as_view(), name="password-change"),
    path("password-reset/", views.PasswordReset.as_view(), name="password-reset"),
    path(
        "password-reset/sent/",
        auth_views.PasswordResetDoneView.as_view(template_name="tick/password_reset_sent.html"),
        name="password-reset-sent",
    ),
    path(
        "password-reset/<uidb64>/<token>/",
        views.PasswordResetConfirm.as_view(),
        name="password-reset-confirm",
    ),
    path(
        "password-reset/done/",
        auth_views.PasswordResetCompleteView.as_view(
            template_name="tick/password_reset_complete.html"
        ),
        name="password-reset-complete",
    ),
    path("tenant/switch/", views.tenant_switch, name="tenant-switch"),
    path("keys/", views.api_keys, name="api-keys"),
    path("keys/<str:key_id>/revoke/", views.api_key_revoke, name="api-key-revoke"),
    path("signing/", views.signing_secrets, name="signing-secrets"),
    path("docs/webhooks/", views.webhooks_guide, name="webhooks-guide"),
    path(
        "signing/<str:secret_id>/revoke/",
        views.signing_secret_revoke_view,
        name="signing-secret-revoke",
    ),
    path("members/", views.members, name="members"),
    path("members/<str:membership_id>/role/", views.member_role_view, name="member-role"),
    path("members/<str:membership_id>/remove/", views.member_remove_view, name="member-remove"),
    path(
        "invitations/<str:invitation_id>/resend/",
        views.invitation_resend_view,
        name="invitation-resend",
    ),
    path(
        "invitations/<str:invitation_id>/revoke/",
        views.invitation_revoke_view,
        name="invitation-revoke",
    ),
    path("invite/<str:token>/", views.invitation_accept_view, name="invitation-accept"),
    path("activity/", views.activity, name="activity"),
]
