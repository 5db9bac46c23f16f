from django.apps import AppConfig


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
