"""Login throttling (django-axes) on the tenant /login/ and the admin's /admin/login/: five
failed passwords for a username lock it, right password or not, with a 429 page saying
until when; the lock lifts after the cool-off; a successful login clears the count; API keys
and other usernames are untouched (docs/decisions.md "Login throttling and two-factor")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from axes.models import AccessAttempt
from django.http import HttpRequest

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 10, 9, 0, tzinfo=UTC)
LOCK_TEXT = b"Log-ins for it are locked, even with the right password, until"


@pytest.fixture
def staff(django_user_model, settings):
    # Password failures are what is throttled; the admin's code is another test file's subject.
    settings.TICK_ADMIN_OTP_REQUIRED = False
    return django_user_model.objects.create_user(
        "sam", password="pw-sam-123", is_staff=True, is_superuser=True
    )


def _login(client, path: str, username: str, password: str):
    return client.post(path, {"username": username, "password": password})


def _assert_locked(response, until: datetime) -> None:
    assert response.status_code == 429
    assert LOCK_TEXT in response.content
    assert f"{until:%Y-%m-%d %H:%M:%S} UTC".encode() in response.content
    assert int(response["Retry-After"]) == round((until - datetime.now(UTC)).total_seconds())


@time_machine.travel(T0, tick=False)
@pytest.mark.parametrize(
    ("path", "user_fixture", "username", "password", "landing"),
    [
        ("/login/", "alice", "alice", "pw-alice-123", "/"),
        ("/admin/login/", "staff", "sam", "pw-sam-123", "/admin/"),
    ],
)
def test_the_sixth_attempt_is_refused_even_with_the_right_password(
    client, request, path, user_fixture, username, password, landing
):
    request.getfixturevalue(user_fixture)

    # given four failures: the form says so and lets the user try again
    for _ in range(4):
        response = _login(client, path, username, "wrong")
        assert response.status_code == 200
        assert LOCK_TEXT not in response.content
    # the fifth reaches the limit: the page says the account is now locked, and until when
    _assert_locked(_login(client, path, username, "wrong"), T0 + timedelta(minutes=15))

    # when the sixth attempt has the right password
    response = _login(client, path, username, password)

    # then it is refused all the same, and nobody is logged in
    _assert_locked(response, T0 + timedelta(minutes=15))
    assert "_auth_user_id" not in client.session
    assert client.get(landing).status_code == 302


def test_failures_on_both_login_pages_count_together(client, staff):
    for _ in range(3):
        assert _login(client, "/login/", "sam", "wrong").status_code == 200
    assert _login(client, "/admin/login/", "sam", "wrong").status_code == 200

    assert _login(client, "/admin/login/", "sam", "wrong").status_code == 429
    assert _login(client, "/login/", "sam", "pw-sam-123").status_code == 429


def test_the_lock_lifts_after_the_cool_off_and_not_before(client, alice):
    with time_machine.travel(T0, tick=False) as clock:
        for _ in range(5):
            _login(client, "/login/", "alice", "wrong")

        # attempts while locked do not push the end further out
        clock.move_to(T0 + timedelta(minutes=14, seconds=59))
        _assert_locked(
            _login(client, "/login/", "alice", "pw-alice-123"), T0 + timedelta(minutes=15)
        )
        _assert_locked(_login(client, "/login/", "alice", "wrong"), T0 + timedelta(minutes=15))

        clock.move_to(T0 + timedelta(minutes=15, seconds=1))
        response = _login(client, "/login/", "alice", "pw-alice-123")

        assert response.status_code == 302
        assert response["Location"] == "/"
        assert client.get("/").status_code == 200


def test_the_cool_off_is_a_setting(client, alice, settings):
    settings.AXES_COOLOFF_TIME = timedelta(minutes=2)
    with time_machine.travel(T0, tick=False) as clock:
        for _ in range(5):
            _login(client, "/login/", "alice", "wrong")
        _assert_locked(
            _login(client, "/login/", "alice", "pw-alice-123"), T0 + timedelta(minutes=2)
        )

        clock.move_to(T0 + timedelta(minutes=2, seconds=1))
        assert _login(client, "/login/", "alice", "pw-alice-123").status_code == 302


def test_a_successful_login_resets_the_count(client, alice):
    for _ in range(4):
        _login(client, "/login/", "alice", "wrong")
    assert _login(client, "/login/", "alice", "pw-alice-123").status_code == 302
    client.post("/logout/")

    # four more failures: without the reset these would be eight, well past the limit
    for _ in range(4):
        assert _login(client, "/login/", "alice", "wrong").status_code == 200
    response = _login(client, "/login/", "alice", "pw-alice-123")

    assert response.status_code == 302
    assert client.get("/").status_code == 200


def test_the_lock_is_per_username(client, alice, bob):
    for _ in range(5):
        _login(client, "/login/", "alice", "wrong")

    # same client, same address: bob is not locked with alice
    assert _login(client, "/login/", "bob", "pw-bob-123").status_code == 302


def test_api_keys_are_not_throttled_and_do_not_count(client, alice, api_a, tenant_a):
    from rest_framework.test import APIClient

    for _ in range(5):
        _login(client, "/login/", "alice", "wrong")
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION="Bearer tick_not-a-key")
    for _ in range(10):
        assert stranger.get("/api/v1/schedules").status_code == 401

    # the tenant's key works while its admin's web login is locked
    assert api_a.get("/api/v1/schedules").status_code == 200
    # and wrong keys were never counted as password failures
    assert list(AccessAttempt.objects.values_list("username", flat=True)) == ["alice"]


def test_axes_reset_command_unlocks_a_user(client, alice):
    from django.core.management import call_command

    for _ in range(5):
        _login(client, "/login/", "alice", "wrong")
    assert _login(client, "/login/", "alice", "pw-alice-123").status_code == 429

    call_command("axes_reset_username", "alice")

    assert _login(client, "/login/", "alice", "pw-alice-123").status_code == 302


def test_the_test_clients_login_needs_the_request_axes_counts_on(client, alice):
    # django-axes' backend refuses authenticate() without a request (docs/decisions.md):
    # tests log in with force_login(), or hand login() a request as axes documents.
    assert client.login(request=HttpRequest(), username="alice", password="pw-alice-123")
    assert client.get("/").status_code == 200
