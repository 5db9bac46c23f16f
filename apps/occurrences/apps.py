from django.apps import AppConfig


class OccurrencesConfig(AppConfig):
    name = "apps.occurrences"
    label = "occurrences"
    default_auto_field = "django.db.models.BigAutoField"
