from django.apps import AppConfig


class OccurrencesConfig(AppConfig):
    name = "apps.occurrences"
    label = "occurrences"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Register Tick's metrics in every process, so /metrics shows them from the start.
        from apps.occurrences.observability import metrics  # noqa: F401
