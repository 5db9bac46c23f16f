from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from apps.tenants.services import idempotency_purge


class Command(BaseCommand):
    help = "Delete Idempotency-Key rows older than TICK_IDEMPOTENCY_TTL_S (run e.g. hourly)."

    def handle(self, *args: Any, **options: Any) -> None:
        total = 0
        while deleted := idempotency_purge(now=timezone.now()):
            total += deleted
        self.stdout.write(f"purged {total} idempotency keys")
