"""Invitations are no mail cannon: addresses with an IP literal, a dotless or a local host are
refused (400 naming the field); invitation mails, new and re-sent, are counted per tenant and
hour (429 with Retry-After beyond)."""

from __future__ import annotations

import pytest
from django.core import mail

from apps.tenants.models import Invitation

pytestmark = pytest.mark.django_db

LOCAL_ADDRESSES = ["ops@[10.0.0.5]", "ops@localhost", "ops@[127.0.0.1]", "ops@mail.internal",
                   "ops@printer.local", "ops@intranet"]  # fmt: skip


@pytest.mark.parametrize("address", LOCAL_ADDRESSES)
def test_an_invitation_to_an_ip_literal_or_local_host_is_refused(api_a, address):
    response = api_a.post("/api/v1/invitations", {"email": address, "role": "viewer"},
                          format="json")  # fmt: skip
    assert response.status_code == 400, response.content
    assert "email" in response.json()["error"]["fields"]
    assert not Invitation.objects.exists()


def test_invitation_mails_are_limited_per_tenant_and_hour(
    api_a, settings, django_capture_on_commit_callbacks
):
    settings.TICK_INVITATION_MAILS_PER_HOUR = 3
    with django_capture_on_commit_callbacks(execute=True):
        created = api_a.post("/api/v1/invitations", {"email": "x@example.com", "role": "viewer"},
                             format="json")  # fmt: skip
        resends = [api_a.post(f"/api/v1/invitations/{created.json()['id']}/resend").status_code
                   for _ in range(3)]  # fmt: skip
        other = api_a.post("/api/v1/invitations", {"email": "y@example.com", "role": "viewer"},
                           format="json")  # fmt: skip

    assert created.status_code == 201
    assert resends == [200, 200, 429]
    assert other.status_code == 429 and int(other["Retry-After"]) > 0
    assert len(mail.outbox) == 3
