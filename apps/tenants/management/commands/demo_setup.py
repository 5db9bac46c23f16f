from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.schedules.models import Schedule
from apps.schedules.services import ScheduleSpec, schedule_create
from apps.tenants.models import Tenant
from apps.tenants.services import api_key_create, demo_user_ensure, membership_grant, tenant_create


class Command(BaseCommand):
    help = (
        "Idempotently create the demo tenant, a web login, a fresh API key (printed) and one "
        "demo schedule firing every minute. For `make run`; not for production."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--password", default="tick-demo")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug="demo").first() or tenant_create(
            slug="demo", name="Demo tenant"
        )
        user = demo_user_ensure(username="demo", password=options["password"])
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
        _, raw = api_key_create(tenant=tenant, name="make run")
        self.stdout.write(
            f"web login: http://127.0.0.1:8000/admin/  user demo / {options['password']}"
        )
        self.stdout.write(
            "try: curl -H 'Authorization: Bearer <key>' "
            "'http://127.0.0.1:8000/api/v1/occurrences?page_size=5'"
        )
        self.stdout.write(f"api key: {raw}")
