from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from apps.tenants.errors import RefusedRequest
from apps.tenants.models import Membership, Tenant
from apps.tenants.services import OPERATOR_ACTOR, api_key_create


class Command(BaseCommand):
    help = "Create an API key for a tenant; prints the key (shown once) as the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="created by api_key_create")
        parser.add_argument("--expires-in-days", type=int, default=None)
        parser.add_argument(
            "--role",
            choices=Membership.Role.values,
            default=Membership.Role.ADMIN,
            help="viewer: reads members and invitations in the API, changes nothing there",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["slug"]).first()
        if tenant is None:
            raise CommandError(f"no tenant {options['slug']!r}")
        days = options["expires_in_days"]
        if days is not None and days <= 0:
            raise CommandError("--expires-in-days must be positive")
        expires_at = timezone.now() + timedelta(days=days) if days else None
        try:
            key, raw = api_key_create(
                tenant=tenant,
                name=options["name"],
                expires_at=expires_at,
                role=Membership.Role(options["role"]),
                actor=OPERATOR_ACTOR,
            )
        except ValidationError as err:
            raise CommandError(f"--name: {' '.join(err.messages)}") from None
        except RefusedRequest as err:
            raise CommandError(err.message) from None
        until = expires_at.isoformat() if expires_at else "never"
        self.stdout.write(f"key {key.prefix}… ({key.role}) for {tenant.slug}, expires {until}")
        self.stdout.write(raw)
