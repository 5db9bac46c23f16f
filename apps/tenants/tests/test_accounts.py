"""The signed-in person's account: the session list, "sign out everywhere", password change
and reset (locmem outbox; the real-SMTP round trip is test_smtp.py) — all audited."""

from __future__ import annotations

import re

import pytest
from django.core import mail
from django.http import HttpRequest
from django.test import Client

from apps.tenants.devices import device_label
from apps.tenants.models import Membership, TenantEvent, UserSession
from apps.tenants.services import membership_grant
from apps.tenants.tests.mails import link_in

pytestmark = pytest.mark.django_db


def _sign_in(username: str, password: str, agent: str) -> Client:
    client = Client(HTTP_USER_AGENT=agent)
    response = client.post("/login/", {"username": username, "password": password})
    assert response.status_code == 302
    return client


def test_the_account_page_lists_each_signed_in_device(alice, tenant_a):
    laptop = _sign_in("alice", "pw-alice-123", "Firefox on laptop")
    _sign_in("alice", "pw-alice-123", "Safari on phone")

    page = laptop.get("/account/")

    assert page.status_code == 200
    assert "Signed in on 2 devices" in page.content.decode()
    rows = page.context["sessions"]
    assert {r.user_agent for r in rows} == {"Firefox on laptop", "Safari on phone"}
    assert [r.user_agent for r in rows if r.current] == ["Firefox on laptop"]


def test_session_rows_are_not_rewritten_on_every_request(alice, tenant_a):
    laptop = _sign_in("alice", "pw-alice-123", "Firefox")
    row = UserSession.objects.get()
    for _ in range(3):
        laptop.get("/")

    assert UserSession.objects.get().last_seen_at == row.last_seen_at


def test_sign_out_everywhere_ends_the_other_sessions_only(alice, bob, tenant_a, tenant_b):
    membership_grant(user=alice, tenant=tenant_b, role=Membership.Role.VIEWER)
    here = _sign_in("alice", "pw-alice-123", "here")
    phone = _sign_in("alice", "pw-alice-123", "phone")
    tablet = _sign_in("alice", "pw-alice-123", "tablet")
    someone_else = _sign_in("bob", "pw-bob-123", "bob's")

    response = here.post("/account/sessions/revoke/", follow=True)

    assert "Signed out of 2 other session(s)" in response.content.decode()
    assert phone.get("/").status_code == 302  # back to the login page
    assert tablet.get("/").status_code == 302
    assert here.get("/").status_code == 200
    assert someone_else.get("/").status_code == 200
    assert "Signed in on 1 device" in here.get("/account/").content.decode()
    # audited in both tenants alice belongs to
    for tenant in (tenant_a, tenant_b):
        event = TenantEvent.objects.get(tenant=tenant, kind=TenantEvent.Kind.SESSIONS_REVOKED)
        assert (event.actor, event.detail) == ("user:alice", {"sessions": 2})


def test_password_change_keeps_this_session_ends_the_others_and_is_audited(alice, tenant_a):
    here = _sign_in("alice", "pw-alice-123", "here")
    other = _sign_in("alice", "pw-alice-123", "other")

    response = here.post(
        "/account/password/",
        {
            "old_password": "pw-alice-123",
            "new_password1": "N3w-secret-pw",
            "new_password2": "N3w-secret-pw",
        },
    )

    assert response.status_code == 302 and response["Location"] == "/account/"
    assert here.get("/").status_code == 200
    assert other.get("/").status_code == 302
    assert "Signed in on 1 device" in here.get("/account/").content.decode()
    assert Client().login(request=HttpRequest(), username="alice", password="N3w-secret-pw")
    event = TenantEvent.objects.get(tenant=tenant_a)
    assert (event.kind, event.detail) == (TenantEvent.Kind.PASSWORD_CHANGED, {"via": "change"})


def test_wrong_current_password_changes_nothing(alice, tenant_a):
    here = _sign_in("alice", "pw-alice-123", "here")

    response = here.post(
        "/account/password/",
        {
            "old_password": "wrong",
            "new_password1": "N3w-secret-pw",
            "new_password2": "N3w-secret-pw",
        },
    )

    assert response.status_code == 200
    assert Client().login(request=HttpRequest(), username="alice", password="pw-alice-123")
    assert not TenantEvent.objects.exists()


def test_password_reset_by_mail_sets_a_new_password_once(client, alice, tenant_a):
    alice.email = "alice@example.com"
    alice.save(update_fields=["email"])
    elsewhere = _sign_in("alice", "pw-alice-123", "a forgotten laptop")

    client.post("/password-reset/", {"email": "ALICE@example.com"})
    link = link_in(mail.outbox[0].body, r"http://testserver(/password-reset/\S+/)")
    form = client.get(link, follow=True)
    target = form.redirect_chain[-1][0]
    done = client.post(target, {"new_password1": "Reset-pw-4410", "new_password2": "Reset-pw-4410"})

    assert done.status_code == 302 and done["Location"] == "/password-reset/done/"
    assert not UserSession.objects.filter(user=alice).exists()  # every session ended
    assert elsewhere.get("/").status_code == 302
    assert Client().login(request=HttpRequest(), username="alice", password="Reset-pw-4410")
    assert b"already used or has expired" in Client().get(link, follow=True).content
    event = TenantEvent.objects.get(tenant=tenant_a)
    assert (event.kind, event.actor, event.detail) == (
        TenantEvent.Kind.PASSWORD_CHANGED, "user:alice", {"via": "reset"},
    )  # fmt: skip


def test_password_reset_for_an_unknown_address_sends_nothing_and_says_the_same(client, alice):
    response = client.post("/password-reset/", {"email": "nobody@example.com"})

    assert response.status_code == 302 and response["Location"] == "/password-reset/sent/"
    assert mail.outbox == []


def test_a_login_is_recorded_at_once_and_later_requests_cost_no_query(alice, tenant_a):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    laptop = _sign_in("alice", "pw-alice-123", "Firefox")
    assert UserSession.objects.filter(user=alice).count() == 1

    with CaptureQueriesContext(connection) as queries:
        laptop.get("/account/sessions/revoke/")  # a GET: 405, after auth and session load

    assert not [q for q in queries.captured_queries if "tenants_usersession" in q["sql"]]


CHROME_LINUX = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/126.0.0.0 Safari/537.36"
)
SAFARI_IPHONE = (
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1"
)


def test_the_account_page_keeps_the_navigation_and_names_devices(alice, tenant_a, tenant_b):
    membership_grant(user=alice, tenant=tenant_b, role=Membership.Role.VIEWER)
    laptop = _sign_in("alice", "pw-alice-123", CHROME_LINUX)
    _sign_in("alice", "pw-alice-123", SAFARI_IPHONE)

    page = laptop.get("/account/").content.decode()
    password = laptop.get("/account/password/").content.decode()

    for shown in (page, password):
        assert '<nav class="nav">' in shown and 'href="/schedules/"' in shown
        assert "Alpha (admin)" in shown and "Bravo (viewer)" in shown  # the tenant switcher
    devices = re.findall(r'<td title="[^"]*">([^<]+)', page)
    assert sorted(d.strip() for d in devices) == ["Chrome on Linux", "Safari on iOS"]
    assert "AppleWebKit" not in re.sub(r'title="[^"]*"', "", page)  # the raw header: a tooltip


@pytest.mark.parametrize(
    ("agent", "label"),
    [
        (CHROME_LINUX, "Chrome on Linux"),
        (SAFARI_IPHONE, "Safari on iOS"),
        ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
         "Chrome/126.0.0.0 Safari/537.36 Edg/126.0.2592.87", "Edge on Windows"),
        ("Mozilla/5.0 (Macintosh; Intel Mac OS X 14.5; rv:127.0) Gecko/20100101 Firefox/127.0",
         "Firefox on macOS"),
        ("Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) "
         "Chrome/126.0.6478.71 Mobile Safari/537.36", "Chrome on Android"),
        ("curl/8.5.0", "curl"),
        ("", "Unknown browser"),
        ("Firefox on laptop", "Unknown browser"),
    ],
)  # fmt: skip
def test_device_labels(agent: str, label: str) -> None:
    assert device_label(agent) == label
