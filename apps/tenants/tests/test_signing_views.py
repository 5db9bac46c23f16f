"""The "Webhook signing" page with the tenancy trio: alice (A's admin) rotates and revokes,
bob (A's viewer) only reads, charlie (B's admin) gets 404 for A's ids."""

from __future__ import annotations

import pytest

from apps.tenants.models import SigningSecret, TenantEvent
from apps.tenants.signing import signing_secret_rotate

pytestmark = pytest.mark.django_db


def _revoke_url(secret: SigningSecret) -> str:
    return f"/signing/{secret.id}/revoke/"


def test_admin_rotates_and_sees_the_secret_once(client, alice, tenant_a):
    client.force_login(alice)

    response = client.post("/signing/")

    assert response.status_code == 200
    [secret] = SigningSecret.objects.filter(tenant=tenant_a)
    raw = response.context["created_raw"]
    assert raw.startswith(secret.prefix) and raw in response.content.decode()
    assert "no-store" in response["Cache-Control"]
    later = client.get("/signing/")
    assert raw not in later.content.decode() and f"{secret.prefix}…" in later.content.decode()
    [event] = TenantEvent.objects.filter(tenant=tenant_a)
    assert (event.kind, event.actor) == (TenantEvent.Kind.SIGNING_SECRET_CREATED, "user:alice")


def test_rotation_lists_both_secrets_and_a_third_is_refused_on_the_page(client, alice, tenant_a):
    client.force_login(alice)
    client.post("/signing/")
    client.post("/signing/")

    page = client.post("/signing/", follow=True).content.decode()

    assert SigningSecret.objects.filter(tenant=tenant_a).count() == 2
    assert "A rotation is in progress" in page
    assert "previous, signing until it expires" in page and ">current<" in page


def test_admin_revokes_the_previous_secret_but_never_the_last(client, alice, tenant_a):
    client.force_login(alice)
    old, _ = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    new, _ = signing_secret_rotate(tenant=tenant_a, actor="user:alice")

    first = client.post(_revoke_url(old), follow=True)
    last = client.post(_revoke_url(new), follow=True)

    assert first.redirect_chain == [("/signing/", 302)]
    assert "revoked" in first.content.decode()
    assert "only active signing secret" in last.content.decode()
    old.refresh_from_db()
    new.refresh_from_db()
    assert old.revoked_at is not None and new.revoked_at is None
    kinds = list(TenantEvent.objects.filter(tenant=tenant_a).values_list("kind", flat=True))
    assert kinds.count(TenantEvent.Kind.SIGNING_SECRET_REVOKED) == 1


def test_viewer_reads_the_page_without_controls_and_cannot_change_anything(client, bob, tenant_a):
    old, _ = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    client.force_login(bob)

    page = client.get("/signing/")

    assert page.status_code == 200
    assert f"{old.prefix}…" in page.content.decode()
    assert b'id="rotate"' not in page.content and b"Revoke</button>" not in page.content
    assert client.post("/signing/").status_code == 403
    assert client.post(_revoke_url(old)).status_code == 403
    assert SigningSecret.objects.filter(tenant=tenant_a).count() == 2
    old.refresh_from_db()
    assert old.revoked_at is None


def test_outsider_gets_404_for_another_tenants_secret(client, charlie, tenant_a, tenant_b):
    theirs, _ = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    client.force_login(charlie)

    response = client.post(_revoke_url(theirs))
    page = client.get("/signing/").content.decode()

    assert response.status_code == 404
    assert client.post("/signing/not-a-uuid/revoke/").status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
    assert theirs.prefix not in page


def test_the_page_has_no_inline_script_or_style(client, alice, tenant_a):
    signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    client.force_login(alice)

    html = client.post("/signing/").content.decode()

    assert "<script>" not in html and " onclick=" not in html and " onsubmit=" not in html
    assert 'style="' not in html.split("</header>")[1]


def test_support_admin_lists_secrets_without_the_secret(admin_client, tenant_a):
    row, raw = signing_secret_rotate(tenant=tenant_a, actor="user:alice")

    page = admin_client.get("/admin/tenants/signingsecret/")
    detail = admin_client.get(f"/admin/tenants/signingsecret/{row.id}/change/")

    assert page.status_code == detail.status_code == 200
    assert row.prefix in page.content.decode()
    for html in (page.content.decode(), detail.content.decode()):
        assert raw not in html and row.secret_encrypted not in html
    assert admin_client.post(f"/admin/tenants/signingsecret/{row.id}/delete/").status_code == 403
