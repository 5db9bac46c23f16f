from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.tenants.models import Tenant
from apps.tenants.services import OPERATOR_ACTOR, api_key_create, tenant_create


class Command(BaseCommand):
    help = "Create a tenant with default quotas; with --api-key, print a new key as the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default=None)
        parser.add_argument("--api-key", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        if Tenant.objects.filter(slug=options["slug"]).exists():
            raise CommandError(f"tenant {options['slug']!r} already exists")
        try:
            tenant = tenant_create(slug=options["slug"], name=options["name"])
        except ValidationError as err:
            raise CommandError(f"--name: {' '.join(err.messages)}") from None
        self.stdout.write(f"created tenant {tenant.slug} ({tenant.id})")
        if options["api_key"]:
            _, raw = api_key_create(
                tenant=tenant, name="created by tenant_create", actor=OPERATOR_ACTOR
            )
            self.stdout.write(raw)
