from django.apps import AppConfig
from django.contrib.admin.apps import AdminConfig


class TickwebConfig(AppConfig):
    """The project package as an app, only so that its system checks are registered."""

    name = "tickweb"
    label = "tickweb"

    def ready(self) -> None:
        from tickweb import checks  # noqa: F401


class TickAdminConfig(AdminConfig):
    """django.contrib.admin whose default site (`admin.site`, also behind every
    `admin.site.admin_view`) requires a verified TOTP device when TICK_ADMIN_OTP_REQUIRED."""

    default_site = "tickweb.admin_site.TickAdminSite"
