"""The Celery application: workers run occurrences' handlers (apps/occurrences/tasks.py)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tickweb.settings")

app = Celery("tickweb")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
