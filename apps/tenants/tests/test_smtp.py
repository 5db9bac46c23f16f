"""The one real-SMTP test: a local SMTP server (aiosmtpd) started by the test on a free port,
Django's SMTP backend configured from an EMAIL_URL, and a password reset done end to end —
the mail read from the server, its link followed, a new password set, and a sign-in."""

from __future__ import annotations

import email
import socket
from collections.abc import Iterator
from email.message import Message
from typing import Any

import dj_email_url
import pytest
from aiosmtpd.controller import Controller
from django.http import HttpRequest
from django.test import Client

from apps.tenants.tests.mails import link_in

pytestmark = pytest.mark.django_db


class Mailbox:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.messages.append(email.message_from_bytes(envelope.original_content))
        return "250 Message accepted for delivery"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def smtp_server(settings: Any) -> Iterator[Mailbox]:
    mailbox = Mailbox()
    port = _free_port()
    controller = Controller(mailbox, hostname="127.0.0.1", port=port)
    controller.start()
    # Configured exactly as production is: from one URL.
    for name, value in dj_email_url.parse(f"smtp://127.0.0.1:{port}/?timeout=5").items():
        setattr(settings, name, value)
    settings.DEFAULT_FROM_EMAIL = "Tick <tick@example.com>"
    try:
        yield mailbox
    finally:
        controller.stop()


def test_password_reset_round_trip_through_a_real_smtp_server(smtp_server, alice, tenant_a):
    alice.email = "alice@example.com"
    alice.save(update_fields=["email"])
    browser = Client()

    browser.post("/password-reset/", {"email": "alice@example.com"})

    # the mail arrived at the SMTP server, from the configured sender
    assert len(smtp_server.messages) == 1
    received = smtp_server.messages[0]
    assert received["To"] == "alice@example.com"
    assert received["From"] == "Tick <tick@example.com>"
    assert received["Subject"] == "Reset your Tick password"
    body = received.get_payload(decode=True).decode()
    link = link_in(body, r"http://testserver(/password-reset/\S+/)")
    # following it, setting a new password, signing in with it
    form = browser.get(link, follow=True)
    assert b"Set a new password" in form.content
    done = browser.post(
        form.redirect_chain[-1][0],
        {"new_password1": "Smtp-reset-778", "new_password2": "Smtp-reset-778"},
    )
    assert done["Location"] == "/password-reset/done/"
    signed_in = Client()
    response = signed_in.post("/login/", {"username": "alice", "password": "Smtp-reset-778"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert signed_in.get("/").context["request"].tick.tenant == tenant_a
    assert not Client().login(request=HttpRequest(), username="alice", password="pw-alice-123")
