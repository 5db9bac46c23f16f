"""Web UI routes of tenants: log in/out, tenant switch, API keys, webhook signing, members."""

from django.contrib.auth import views as auth_views
from django.urls import path

from apps.tenants import views

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("tenant/switch/", views.tenant_switch, name="tenant-switch"),
    path("keys/", views.api_keys, name="api-keys"),
    path("keys/<str:key_id>/revoke/", views.api_key_revoke, name="api-key-revoke"),
    path("signing/", views.signing_secrets, name="signing-secrets"),
    path(
        "signing/<str:secret_id>/revoke/",
        views.signing_secret_revoke_view,
        name="signing-secret-revoke",
    ),
    path("members/", views.members, name="members"),
]
