"""The dispatch lanes. Kept apart from the models so that the RabbitMQ topology
(pipeline/queues.py) can be built before Django's apps are loaded: Celery declares its queues
from it while configuring, when importing a models module would fail."""

from __future__ import annotations

from django.db import models


class Lane(models.TextChoices):
    STRICT = "strict", "Strict"
    FLEXIBLE = "flexible", "Flexible"
    CATCHUP = "catchup", "Catch-up"
    RETRY = "retry", "Retry"
