from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.schedules.models import Schedule
from apps.schedules.services import ScheduleSpec, schedule_create
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.services import (
    DEMO_PASSWORD,
    api_key_create,
    api_keys_revoke,
    demo_user_ensure,
    membership_grant,
    tenant_create,
)

DEMO_KEY_NAME = "make run"


class Command(BaseCommand):
    help = (
        "Idempotently create the demo tenant, a web login, a fresh API key (printed) and one "
        "demo schedule firing every minute. For `make run`; not for production. With "
        "DJANGO_DEBUG off the login gets a random password, printed once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--password",
            default=None,
            help="the demo login's password when it is created (default: tick-demo with "
            "DJANGO_DEBUG=1, else random); an existing login keeps its password",
        )
        parser.add_argument("--port", type=int, default=8000, help="web port, for the URLs printed")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug="demo").first() or tenant_create(
            slug="demo", name="Demo tenant"
        )
        try:
            user, password = demo_user_ensure(
                username="demo", password=options["password"], allow_known_password=settings.DEBUG
            )
        except ValidationError as err:
            raise CommandError(err.messages[0]) from err
        if not user.is_staff:  # type: ignore[attr-defined]
            user.is_staff = user.is_superuser = True  # type: ignore[attr-defined]
            user.save(update_fields=["is_staff", "is_superuser"])
        membership_grant(user=user, tenant=tenant)
        if not Schedule.objects.filter(tenant=tenant, name="demo: every minute").exists():
            schedule_create(
                tenant=tenant,
                spec=ScheduleSpec(
                    name="demo: every minute",
                    kind=Schedule.Kind.CRON,
                    expression="* * * * *",
                    time_zone="Europe/Berlin",
                    handler="record",
                    payload={"hello": "tick"},
                ),
                actor="demo_setup",
            )
        # One demo key at a time: each run replaces the previous run's (the tenant's keys are
        # capped, and an unused credential is no use lying around).
        previous = ApiKey.objects.filter(
            tenant=tenant, name=DEMO_KEY_NAME, created_by__isnull=True, revoked_at__isnull=True
        )
        api_keys_revoke(key_ids=list(previous.values_list("pk", flat=True)), actor="demo_setup")
        _, raw = api_key_create(tenant=tenant, name=DEMO_KEY_NAME, actor="demo_setup")
        base = f"http://127.0.0.1:{options['port']}"
        if password is not None:
            self.stdout.write(f"login: user demo / {password} (tenant UI and admin)")
            if not settings.DEBUG:
                self.stdout.write("(shown once: note it now; a rerun keeps it)")
        elif settings.DEBUG and user.check_password(DEMO_PASSWORD):
            self.stdout.write(f"login: user demo / {DEMO_PASSWORD} (tenant UI and admin)")
        else:
            self.stdout.write("login: user demo (password unchanged)")
        self.stdout.write(f"tenant UI: {base}/")
        self.stdout.write(f"admin:     {base}/admin/")
        self.stdout.write(f"api key: {raw}")
        # The command as it can be pasted: the real key, and the runs that reached SUCCEEDED
        # (the list is newest first, so unfiltered it starts with future SCHEDULED rows).
        self.stdout.write(
            f"watch the demo: curl -H 'Authorization: Bearer {raw}' "
            f"'{base}/api/v1/occurrences?state=succeeded&page_size=5'"
        )
