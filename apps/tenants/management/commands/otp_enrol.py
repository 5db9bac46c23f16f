from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.tenants.login_security import EnrolRefused, totp_enrol


class Command(BaseCommand):
    help = (
        "Enrol a staff user's authenticator app for the admin site's two-factor login: "
        "creates a confirmed TOTP device and prints its otpauth:// URI and base32 secret."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--replace",
            action="store_true",
            help="replace the user's existing authenticator (its codes stop working)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user {options['username']!r}")
        try:
            enrolment = totp_enrol(user=user, replace=options["replace"])
        except EnrolRefused as refused:
            raise CommandError(str(refused)) from refused
        self.stdout.write(
            f"TOTP device enrolled for {user.get_username()}. Add it to an authenticator app "
            "(scan the URI as a QR code, or type the secret); it is shown only now."
        )
        self.stdout.write(f"secret: {enrolment.secret_base32}")
        self.stdout.write(enrolment.uri)
