"""Staff access the web role cannot declare (docs/security.md "Staff access"): as the web
role, `set_config('tick.staff', 'on')` — or any claim not signed for this connection, user
and time — shows no other tenant's row; the one the admin signs after the second factor
shows them all. Without a tenant the web role reads no other user's sessions, TOTP devices
or rate windows."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from apps.occurrences.tests.support.rows import schedule
from apps.tenants import rls
from apps.tenants.models import ApiKey, UserSession
from apps.tenants.services import api_key_create, api_rate_hit

pytestmark = [pytest.mark.django_db, pytest.mark.urls("apps.tenants.tests.rls_probe")]

TABLES = ["schedules_schedule", "tenants_tenant", "tenants_apikey", "tenants_tenantevent",
          "tenants_usersession", "otp_totp_totpdevice", "tenants_apiratewindow"]  # fmt: skip


def _counts() -> dict[str, int]:
    out = {}
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f'SELECT count(*) FROM "{table}"')
            out[table] = cursor.fetchone()[0]
    return out


@pytest.fixture
def world(tenant_a: Any, tenant_b: Any, alice: Any, charlie: Any) -> dict[str, Any]:
    """Each tenant a schedule, a used key (its rate window), a signed-in session and a TOTP
    device of its admin."""
    from django_otp.plugins.otp_totp.models import TOTPDevice

    now = timezone.now()
    for tenant, user in ((tenant_a, alice), (tenant_b, charlie)):
        schedule(tenant)
        api_key_create(tenant=tenant, name="k", actor="t")
        api_rate_hit(tenant=tenant, limit_per_min=10, now=now)
        UserSession.objects.create(
            session_key=f"s-{user.username}", user=user, created_at=now, last_seen_at=now
        )
        TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    return {"alice": alice, "charlie": charlie, "a": tenant_a}


@pytest.fixture
def as_web_role() -> Iterator[Any]:
    """Raw SQL as the web role, in the test's transaction (as an injected statement would
    run), with the settings it chooses."""

    def settings(**values: str) -> None:
        names = {"tenant": rls.TENANT_SETTING, "user": rls.USER_SETTING,
                 "staff": rls.STAFF_SETTING}  # fmt: skip
        with connection.cursor() as cursor:
            for name, value in values.items():
                cursor.execute("SELECT set_config(%s, %s, true)", [names[name], value])

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('role', %s, true)", [rls.web_role()])
        yield settings
        transaction.set_rollback(True)


def _pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def test_declaring_staff_as_the_web_role_shows_no_other_tenants_row(world, as_web_role):
    as_web_role(tenant=str(world["a"].id), user=str(world["alice"].pk), staff="on")

    assert _counts() == {
        "schedules_schedule": 1, "tenants_tenant": 1, "tenants_apikey": 1,
        "tenants_tenantevent": 1, "tenants_usersession": 1, "otp_totp_totpdevice": 1,
        "tenants_apiratewindow": 1,
    }  # fmt: skip


def test_without_a_tenant_or_user_the_web_role_reads_nothing_even_as_declared_staff(
    world, as_web_role
):
    as_web_role(staff="on")

    assert set(_counts().values()) == {0}


def test_a_signed_in_users_own_sessions_and_devices_only(world, as_web_role):
    as_web_role(user=str(world["charlie"].pk))

    counts = _counts()

    assert (counts["tenants_usersession"], counts["otp_totp_totpdevice"]) == (1, 1)
    assert counts["schedules_schedule"] == counts["tenants_apiratewindow"] == 0
    assert list(UserSession.objects.values_list("session_key", flat=True)) == ["s-charlie"]


def test_forged_replayed_and_expired_claims_open_nothing(world, as_web_role):
    user = world["alice"].pk
    later = int(time.time()) + 300
    forged = f"{later}.{'0' * 64}"
    other_backend = rls.staff_claim_sign(pid=_pid() + 1, user_id=user, expires=later)
    other_user = rls.staff_claim_sign(pid=_pid(), user_id=world["charlie"].pk, expires=later)
    expired = rls.staff_claim_sign(pid=_pid(), user_id=user, expires=int(time.time()) - 5)

    for claim in (forged, other_backend, other_user, expired, "on", "1", "true"):
        as_web_role(user=str(user), staff=claim)
        assert _counts()["schedules_schedule"] == 0, claim


def test_a_claim_signed_for_this_connection_shows_every_tenant(world, as_web_role):
    user = world["alice"].pk
    claim = rls.staff_claim_sign(pid=_pid(), user_id=user, expires=int(time.time()) + 60)
    as_web_role(user=str(user), staff=claim)

    counts = _counts()

    assert counts["schedules_schedule"] == 2
    assert counts["tenants_usersession"] == counts["otp_totp_totpdevice"] == 2


def test_the_web_role_cannot_read_the_claims_key(as_web_role):
    with pytest.raises(DatabaseError, match="permission denied"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT key FROM {rls.STAFF_KEY_TABLE}")


def test_a_password_only_staff_session_gets_no_staff_view(
    client, world, settings, partitions_around_today
):
    settings.TICK_ADMIN_OTP_REQUIRED = True
    from django.contrib.auth import get_user_model

    staff = get_user_model().objects.create_user("sam", password="pw-sam-123", is_staff=True)
    client.force_login(staff)  # a password, no second factor

    body = client.get("/admin/rls-probe/").json()

    assert (body["schedules_sql"], body["tenants"], body["api_keys"]) == (0, [], 0)
    assert ApiKey.objects.count() == 2  # the rows are there; the wall hid them


def test_staff_see_every_tenant_once_the_second_factor_passed(
    client, world, settings, partitions_around_today
):
    import io

    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from apps.tenants.tests.test_admin_two_factor import rfc6238

    settings.TICK_ADMIN_OTP_REQUIRED = True
    get_user_model().objects.create_user("sam", password="pw-sam-123", is_staff=True)
    out = io.StringIO()
    call_command("otp_enrol", "sam", stdout=out)
    secret = next(
        line.removeprefix("secret: ") for line in out.getvalue().splitlines()
        if line.startswith("secret: ")
    )  # fmt: skip
    # Real time (a claim expires by the database's clock); the device accepts the next and
    # the previous step too, so a step boundary during the test does not matter.
    login = client.post(
        "/admin/login/?next=/admin/",
        {"username": "sam", "password": "pw-sam-123", "next": "/admin/",
         "otp_token": rfc6238(secret, time.time())},
    )  # fmt: skip

    assert login.status_code == 302, login.content.decode()[-2000:]
    assert client.get("/admin/").status_code == 200
    body = client.get("/admin/rls-probe/").json()  # now, with the verified session

    assert (body["schedules_sql"], body["tenants"]) == (2, ["alpha", "bravo"])
