from django.apps import AppConfig


class TickwebConfig(AppConfig):
    """The project package as an app, only so that its system checks are registered."""

    name = "tickweb"
    label = "tickweb"

    def ready(self) -> None:
        from tickweb import checks  # noqa: F401
