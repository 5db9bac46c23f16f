from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.tenants.services import OPERATOR_ACTOR, api_key_revoke


class Command(BaseCommand):
    help = "Revoke API keys by their visible prefix (tick_XXXXXXXX); effective immediately."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("prefix")

    def handle(self, *args: Any, **options: Any) -> None:
        revoked = api_key_revoke(prefix=options["prefix"], actor=OPERATOR_ACTOR)
        if not revoked:
            raise CommandError(f"no unrevoked key with prefix {options['prefix']!r}")
        for key in revoked:
            self.stdout.write(f"revoked {key.prefix}… ({key.name}) of tenant {key.tenant_id}")
