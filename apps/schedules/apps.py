from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    name = "apps.schedules"
    label = "schedules"
    default_auto_field = "django.db.models.BigAutoField"
