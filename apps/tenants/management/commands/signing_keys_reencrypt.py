from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.tenants.errors import SigningUnavailable
from apps.tenants.signing import signing_secrets_reencrypt


class Command(BaseCommand):
    help = (
        "Re-encrypt every webhook signing secret with the first key of TICK_SIGNING_KEYS; "
        "afterwards the older keys can be removed (docs/webhooks.md)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            count = signing_secrets_reencrypt()
        except SigningUnavailable as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"re-encrypted {count} signing secrets")
