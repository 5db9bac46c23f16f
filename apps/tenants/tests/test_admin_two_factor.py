"""The admin's TOTP second factor (TICK_ADMIN_OTP_REQUIRED, on unless DEBUG) and the
`otp_enrol` command. Codes come from the independent RFC 6238 implementation below, never
from django-otp's own helpers, so a wrong secret or a wrong time step would show."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import struct
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
import time_machine
from django.core.management import CommandError, call_command
from django_otp.plugins.otp_totp.models import TOTPDevice

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 10, 9, 0, 10, tzinfo=UTC)


def rfc6238(secret_base32: str, at: float, *, step: int = 30, digits: int = 6) -> str:
    """TOTP (RFC 6238 over RFC 4226's HOTP, HMAC-SHA1) of a base32 secret at Unix time `at`."""
    key = base64.b32decode(secret_base32 + "=" * (-len(secret_base32) % 8))
    mac = hmac.new(key, struct.pack(">Q", int(at // step)), hashlib.sha1).digest()
    offset = mac[-1] & 0x0F
    value = struct.unpack(">I", mac[offset : offset + 4])[0] & 0x7FFFFFFF
    return f"{value % 10**digits:0{digits}d}"


def test_the_reference_totp_matches_rfc_6238s_test_vectors():
    secret = base64.b32encode(b"12345678901234567890").decode()

    assert rfc6238(secret, 59, digits=8) == "94287082"
    assert rfc6238(secret, 1111111109, digits=8) == "07081804"
    assert rfc6238(secret, 2000000000, digits=8) == "69279037"


@pytest.fixture
def otp_on(settings):
    # What DJANGO_DEBUG=0 gives (tickweb/settings.py); the test runner's DEBUG says nothing.
    settings.TICK_ADMIN_OTP_REQUIRED = True


@pytest.fixture
def sam(django_user_model):
    return django_user_model.objects.create_user(
        "sam", password="pw-sam-123", is_staff=True, is_superuser=True
    )


def _enrol(username: str, *args: str) -> tuple[str, str]:
    """Run `otp_enrol`; the printed base32 secret and the URI's (checked to be the same)."""
    out = io.StringIO()
    call_command("otp_enrol", username, *args, stdout=out)
    lines = out.getvalue().splitlines()
    uri = next(line for line in lines if line.startswith("otpauth://"))
    printed = next(line for line in lines if line.startswith("secret: ")).removeprefix("secret: ")
    parts = urlsplit(uri)
    query = parse_qs(parts.query)
    assert parts.netloc == "totp"
    assert unquote(parts.path) == f"/Tick:{username}"
    assert query["issuer"] == ["Tick"]
    assert query["digits"] == ["6"] and query["period"] == ["30"]
    assert query["algorithm"] == ["SHA1"]
    assert query["secret"] == [printed]
    return printed, uri


def _admin_login(client, password: str = "pw-sam-123", code: str = ""):
    return client.post(
        "/admin/login/?next=/admin/",
        {"username": "sam", "password": password, "otp_token": code, "next": "/admin/"},
    )


def test_with_otp_on_a_password_alone_does_not_open_the_admin(client, otp_on, sam):
    _enrol("sam")

    response = _admin_login(client)

    assert response.status_code == 200
    assert b"Enter the 6-digit code of your authenticator app." in response.content
    assert client.get("/admin/").status_code == 302
    assert client.get("/admin/occurrences/browse/").status_code == 302


def test_a_password_only_session_is_sent_back_for_a_code(client, otp_on, sam):
    # e.g. a staff member who logged in on the tenant /login/
    client.force_login(sam)

    for path in ("/admin/", "/admin/occurrences/browse/", "/admin/auth/user/"):
        response = client.get(path)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")
    page = client.get("/admin/login/")
    assert b"Authenticator code" in page.content


def test_a_staff_user_without_a_device_is_told_how_to_get_one(client, otp_on, sam):
    response = _admin_login(client, code="123456")

    assert response.status_code == 200
    assert b"no authenticator enrolled" in response.content
    assert b"manage.py otp_enrol sam" in response.content
    assert client.get("/admin/").status_code == 302


def test_the_enrolled_secret_yields_codes_the_admin_accepts(client, otp_on, sam):
    with time_machine.travel(T0, tick=False):
        secret, _ = _enrol("sam")

        response = _admin_login(client, code=rfc6238(secret, time.time()))

        assert response.status_code == 302
        assert response["Location"] == "/admin/"
        assert client.get("/admin/").status_code == 200
        assert client.get("/admin/occurrences/browse/").status_code == 200


def test_a_wrong_or_replayed_code_is_refused(client, otp_on, sam):
    with time_machine.travel(T0, tick=False) as clock:
        secret, _ = _enrol("sam")
        good = rfc6238(secret, time.time())
        wrong = f"{(int(good) + 1) % 1_000_000:06d}"

        assert b"That code is wrong" in _admin_login(client, code=wrong).content
        assert client.get("/admin/").status_code == 302

        clock.shift(timedelta(seconds=5))  # past django-otp's back-off after one failure
        assert _admin_login(client, code=good).status_code == 302
        client.post("/admin/logout/")

        # the same code a second time (same 30 s step) is refused
        clock.shift(timedelta(seconds=5))
        assert b"That code is wrong" in _admin_login(client, code=good).content
        assert client.get("/admin/").status_code == 302


def test_with_otp_off_the_admin_is_as_before(client, settings, sam):
    settings.TICK_ADMIN_OTP_REQUIRED = False

    response = _admin_login(client)

    assert response.status_code == 302
    assert client.get("/admin/").status_code == 200


def test_enrolling_again_is_refused_unless_replaced(client, otp_on, sam):
    with time_machine.travel(T0, tick=False) as clock:
        old, _ = _enrol("sam")
        with pytest.raises(CommandError, match="already has an authenticator"):
            _enrol("sam")
        assert TOTPDevice.objects.filter(user=sam).count() == 1

        new, _ = _enrol("sam", "--replace")
        assert new != old
        assert TOTPDevice.objects.filter(user=sam, confirmed=True).count() == 1

        # the old secret no longer opens the admin; the new one does
        assert b"That code is wrong" in _admin_login(client, code=rfc6238(old, time.time())).content
        clock.shift(timedelta(seconds=5))
        assert _admin_login(client, code=rfc6238(new, time.time())).status_code == 302


def test_enrol_refuses_unknown_and_non_staff_users(alice):
    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("otp_enrol", "nobody", stdout=io.StringIO())
    with pytest.raises(CommandError, match="alice is not staff"):
        call_command("otp_enrol", "alice", stdout=io.StringIO())
    assert not TOTPDevice.objects.exists()


def test_password_failures_on_the_otp_admin_login_are_throttled(client, otp_on, sam):
    with time_machine.travel(T0, tick=False):
        secret, _ = _enrol("sam")
        for _ in range(5):
            _admin_login(client, password="wrong", code="000000")

        response = _admin_login(client, code=rfc6238(secret, time.time()))

        assert response.status_code == 429
        assert client.get("/admin/").status_code == 302
