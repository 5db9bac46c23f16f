"""Login throttling and the admin's second factor, as plain operations (docs/decisions.md
"Login throttling and two-factor"). django-axes counts failed passwords and refuses locked-out
usernames; this module answers when such a lock lifts. django-otp verifies TOTP codes; this
module enrols a staff user's authenticator."""

from __future__ import annotations

from base64 import b32encode
from dataclasses import dataclass
from datetime import datetime

from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django_otp.plugins.otp_totp.models import TOTPDevice

TOTP_DEVICE_NAME = "authenticator"


def login_lockout_ends_at(*, username: str, now: datetime) -> datetime | None:
    """When the lock on `username` lifts, or None if it is not locked.

    Mirrors django-axes' rule for AXES_LOCKOUT_PARAMETERS = ["username"]: a username is locked
    while its failures recorded within the cool-off (one row per IP and user agent, each
    stamped with its latest failure) add up to the limit. Walking the rows newest first, the
    row whose failures reach the limit is the one whose ageing-out lifts the lock.
    """
    cooloff = settings.AXES_COOLOFF_TIME
    rows = AccessAttempt.objects.filter(
        username=username, attempt_time__gte=now - cooloff
    ).order_by("-attempt_time")
    failures = 0
    for attempt_time, count in rows.values_list("attempt_time", "failures_since_start"):
        failures += count
        if failures >= settings.TICK_LOGIN_FAILURE_LIMIT:
            ends_at: datetime = attempt_time + cooloff
            return ends_at
    return None


class EnrolRefused(Exception):
    """The user cannot be enrolled as asked (the message says why and what to do)."""


@dataclass(frozen=True)
class TotpEnrolment:
    device: TOTPDevice
    secret_base32: str
    uri: str


def totp_enrol(*, user: AbstractBaseUser, replace: bool = False) -> TotpEnrolment:
    """Give a staff user a confirmed TOTP device and return its secret and otpauth:// URI.

    Refuses a user who already has one unless `replace`: a second run would otherwise silently
    invalidate the authenticator the user relies on. With `replace`, the old devices are
    deleted in the same transaction, so the old secret stops working at once.
    """
    if not getattr(user, "is_staff", False):
        raise EnrolRefused(
            f"{user.get_username()} is not staff; only the admin site asks for a code."
        )
    with transaction.atomic():
        existing = TOTPDevice.objects.select_for_update().filter(user=user)
        if existing.exists() and not replace:
            raise EnrolRefused(
                f"{user.get_username()} already has an authenticator; run again with "
                "--replace to issue a new secret (the old one stops working)."
            )
        existing.delete()
        device = TOTPDevice.objects.create(user=user, name=TOTP_DEVICE_NAME, confirmed=True)
    secret = b32encode(device.bin_key).decode()
    return TotpEnrolment(device=device, secret_base32=secret, uri=device.config_url)
