from django.apps import AppConfig
from django.db.backends.signals import connection_created


class TenantsConfig(AppConfig):
    name = "apps.tenants"
    label = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in

        from apps.tenants.middleware import session_logged_in

        # Session bookkeeping at login, like Django's own last_login update (not domain logic;
        # docs/decisions.md: session list).
        user_logged_in.connect(session_logged_in, dispatch_uid="tick-user-session")
        from apps.tenants import rls

        # A connection reopened mid-request keeps the request's row-level security.
        connection_created.connect(rls.reapply_on_reconnect, dispatch_uid="tick-rls-reapply")
