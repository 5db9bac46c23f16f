"""Webhook signing secrets: stored encrypted, rotated with an overlap, revoked with care, and
the API that manages them (tenancy: another tenant's id is a 404)."""

from __future__ import annotations

import base64
import uuid
from datetime import timedelta
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.db import connection
from django.utils import timezone

from apps.tenants.errors import LastSigningSecret, RotationInProgress, SigningUnavailable
from apps.tenants.models import SigningSecret, TenantEvent
from apps.tenants.signing import (
    signing_keys_for_send,
    signing_secret_revoke,
    signing_secret_rotate,
)
from apps.tenants.tests.races import run_at_once

pytestmark = [pytest.mark.django_db, pytest.mark.clock_edge]


def _events(tenant) -> list[tuple[str, str, dict[str, Any]]]:
    return [(e.kind, e.actor, e.detail) for e in TenantEvent.objects.filter(tenant=tenant)]


def _active_prefixes(tenant, now=None) -> list[str]:
    now = now or timezone.now()
    rows = SigningSecret.objects.filter(tenant=tenant).order_by("-created_at")
    return [s.prefix for s in rows if s.status_at(now) == SigningSecret.Status.ACTIVE]


# --- storage -------------------------------------------------------------------------------


def test_secret_is_stored_encrypted_and_only_its_prefix_in_clear(tenant_a):
    row, raw = signing_secret_rotate(tenant=tenant_a, actor="user:alice")

    assert raw.startswith("whsec_") and len(base64.b64decode(raw[6:])) == 32
    assert row.prefix == raw[:12]
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM tenants_signingsecret WHERE id = %s", [row.id])
        stored = " ".join(str(value) for value in cursor.fetchone())
    assert raw not in stored and raw[6:] not in stored
    # and the worker gets the key back
    assert signing_keys_for_send(tenant_id=tenant_a.id, now=timezone.now()) == [
        base64.b64decode(raw[6:])
    ]


def test_an_explicit_encryption_key_still_reads_secrets_stored_under_the_derived_one(
    tenant_a, settings
):
    _, raw = signing_secret_rotate(tenant=tenant_a, actor="user:alice")

    settings.TICK_SIGNING_KEYS = [Fernet.generate_key().decode()]

    assert signing_keys_for_send(tenant_id=tenant_a.id, now=timezone.now()) == [
        base64.b64decode(raw[6:])
    ]


def test_a_secret_no_configured_key_decrypts_is_refused_not_guessed(tenant_a, settings):
    settings.TICK_SIGNING_KEYS = [Fernet.generate_key().decode()]
    signing_secret_rotate(tenant=tenant_a, actor="user:alice")

    settings.TICK_SIGNING_KEYS = [Fernet.generate_key().decode()]

    with pytest.raises(SigningUnavailable):
        signing_keys_for_send(tenant_id=tenant_a.id, now=timezone.now())


def test_first_webhook_creates_exactly_one_secret_once(tenant_a):
    now = timezone.now()

    first = signing_keys_for_send(tenant_id=tenant_a.id, now=now)
    second = signing_keys_for_send(tenant_id=tenant_a.id, now=now)

    assert len(first) == 1 and first == second
    assert SigningSecret.objects.filter(tenant=tenant_a).count() == 1
    [(kind, actor, _)] = _events(tenant_a)
    assert (kind, actor) == (TenantEvent.Kind.SIGNING_SECRET_CREATED, "system:webhook")


# --- rotation ------------------------------------------------------------------------------


def test_rotation_keeps_the_previous_secret_active_for_the_overlap(tenant_a):
    now = timezone.now()
    old, _ = signing_secret_rotate(tenant=tenant_a, actor="user:alice", now=now - timedelta(1))

    new, _ = signing_secret_rotate(tenant=tenant_a, actor="user:alice", now=now)

    old.refresh_from_db()
    assert old.expires_at == now + timedelta(hours=24)
    assert _active_prefixes(tenant_a, now) == [new.prefix, old.prefix]
    assert len(signing_keys_for_send(tenant_id=tenant_a.id, now=now)) == 2
    # a day later only the new one signs
    later = now + timedelta(hours=24, seconds=1)
    assert _active_prefixes(tenant_a, later) == [new.prefix]
    assert len(signing_keys_for_send(tenant_id=tenant_a.id, now=later)) == 1
    assert _events(tenant_a)[-1] == (
        TenantEvent.Kind.SIGNING_SECRET_ROTATED,
        "user:alice",
        {"secret": new.prefix, "previous": old.prefix,
         "previous_expires_at": old.expires_at.isoformat()},
    )  # fmt: skip


def test_a_third_secret_is_refused_while_a_rotation_is_in_progress(tenant_a):
    signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    before = list(SigningSecret.objects.values_list("id", "expires_at", "revoked_at"))

    with pytest.raises(RotationInProgress):
        signing_secret_rotate(tenant=tenant_a, actor="user:alice")

    assert list(SigningSecret.objects.values_list("id", "expires_at", "revoked_at")) == before


def test_revoking_the_only_active_secret_is_refused(tenant_a):
    row, _ = signing_secret_rotate(tenant=tenant_a, actor="user:alice")

    with pytest.raises(LastSigningSecret):
        signing_secret_revoke(tenant=tenant_a, secret_id=row.id, actor="user:alice")

    row.refresh_from_db()
    assert row.revoked_at is None


def test_revoking_the_new_secret_cancels_the_rotation(tenant_a):
    old, _ = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    new, _ = signing_secret_rotate(tenant=tenant_a, actor="user:alice")

    signing_secret_revoke(tenant=tenant_a, secret_id=new.id, actor="user:alice")

    old.refresh_from_db()
    assert old.expires_at is None  # current again, no expiry
    assert _active_prefixes(tenant_a, timezone.now() + timedelta(days=30)) == [old.prefix]
    assert _events(tenant_a)[-1][2] == {"secret": new.prefix, "current_again": old.prefix}


def test_revoking_the_previous_secret_ends_it_now_and_twice_changes_nothing(tenant_a):
    old, _ = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    new, _ = signing_secret_rotate(tenant=tenant_a, actor="user:alice")

    first = signing_secret_revoke(tenant=tenant_a, secret_id=old.id, actor="user:alice")
    again = signing_secret_revoke(tenant=tenant_a, secret_id=old.id, actor="user:alice")

    assert again.revoked_at == first.revoked_at is not None
    assert _active_prefixes(tenant_a) == [new.prefix]
    kinds = [kind for kind, _, _ in _events(tenant_a)]
    assert kinds.count(TenantEvent.Kind.SIGNING_SECRET_REVOKED) == 1


# --- API -----------------------------------------------------------------------------------


def test_api_rotate_shows_the_secret_once_and_forbids_caching(api_a, tenant_a):
    response = api_a.post("/api/v1/signing-secrets/rotate", {}, format="json")

    assert response.status_code == 201
    assert response["Cache-Control"] == "no-store"
    body = response.json()
    assert body["secret"].startswith(body["prefix"]) and body["status"] == "active"
    listed = api_a.get("/api/v1/signing-secrets")
    assert listed.status_code == 200
    assert [s["id"] for s in listed.json()["results"]] == [body["id"]]
    assert body["secret"] not in listed.content.decode()
    assert set(listed.json()["results"][0]) == {
        "id", "prefix", "status", "created_at", "expires_at", "revoked_at",
    }  # fmt: skip
    [event] = TenantEvent.objects.filter(tenant=tenant_a).exclude(
        kind=TenantEvent.Kind.API_KEY_CREATED  # the fixture's key
    )
    assert event.kind == TenantEvent.Kind.SIGNING_SECRET_CREATED
    assert event.actor.startswith("api-key:tick_")


def test_api_rotate_with_an_overlap_and_the_list_shows_both(api_a):
    old = api_a.post("/api/v1/signing-secrets/rotate", {}, format="json").json()

    new = api_a.post(
        "/api/v1/signing-secrets/rotate", {"previous_expires_in_s": 3600}, format="json"
    ).json()

    rows = {s["id"]: s for s in api_a.get("/api/v1/signing-secrets").json()["results"]}
    assert [s["status"] for s in rows.values()] == ["active", "active"]
    assert rows[new["id"]]["expires_at"] is None
    assert rows[old["id"]]["expires_at"] is not None
    third = api_a.post("/api/v1/signing-secrets/rotate", {}, format="json")
    assert third.status_code == 409
    assert third.json()["error"]["code"] == "rotation_in_progress"


@pytest.mark.parametrize(
    ("body", "field"),
    [({"previous_expires_in_s": -1}, "previous_expires_in_s"),
     ({"previous_expires_in_s": 7 * 86_400 + 1}, "previous_expires_in_s"),
     ({"previous_expires_in_s": "soon"}, "previous_expires_in_s"),
     ({"tenant": "x"}, "tenant")],
)  # fmt: skip
def test_api_rotate_refuses_bad_fields_and_changes_nothing(api_a, body, field):
    response = api_a.post("/api/v1/signing-secrets/rotate", body, format="json")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == [field]
    assert SigningSecret.objects.count() == 0


def test_api_list_refuses_unknown_parameters(api_a):
    response = api_a.get("/api/v1/signing-secrets?status=active")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["status"]


def test_api_revoke_and_the_last_one_is_kept(api_a, tenant_a):
    old = api_a.post("/api/v1/signing-secrets/rotate", {}, format="json").json()
    new = api_a.post("/api/v1/signing-secrets/rotate", {}, format="json").json()

    revoked = api_a.delete(f"/api/v1/signing-secrets/{old['id']}")
    last = api_a.delete(f"/api/v1/signing-secrets/{new['id']}")

    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    assert last.status_code == 409
    assert last.json()["error"]["code"] == "last_signing_secret"
    assert _active_prefixes(tenant_a) == [new["prefix"]]


def test_api_another_tenants_secret_is_a_404_and_stays_untouched(api_a, api_b, tenant_b):
    theirs, _ = signing_secret_rotate(tenant=tenant_b, actor="user:charlie")
    signing_secret_rotate(tenant=tenant_b, actor="user:charlie")  # two: revocable by B

    response = api_a.delete(f"/api/v1/signing-secrets/{theirs.id}")
    unknown = api_a.delete(f"/api/v1/signing-secrets/{uuid.uuid4()}")
    malformed = api_a.delete("/api/v1/signing-secrets/not-a-uuid")

    assert [response.status_code, unknown.status_code, malformed.status_code] == [404] * 3
    assert response.json()["error"]["code"] == "not_found"
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
    assert api_a.get("/api/v1/signing-secrets").json()["results"] == []
    assert not TenantEvent.objects.filter(kind=TenantEvent.Kind.SIGNING_SECRET_REVOKED).exists()


def test_api_needs_a_key(client):
    assert client.get("/api/v1/signing-secrets").status_code == 401
    assert client.post("/api/v1/signing-secrets/rotate").status_code == 401


# --- races (real PostgreSQL row locks, one connection per thread) --------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_calls_create_one_secret_and_all_sign_with_it(tenant_a):
    now = timezone.now()

    keys = run_at_once(4, lambda _: signing_keys_for_send(tenant_id=tenant_a.id, now=now))

    assert all(isinstance(k, list) for k in keys), keys
    assert SigningSecret.objects.filter(tenant=tenant_a).count() == 1
    assert len({tuple(k) for k in keys}) == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_rotations_never_leave_more_than_two_active(tenant_a):
    signing_secret_rotate(tenant=tenant_a, actor="user:alice")

    results = run_at_once(4, lambda _: signing_secret_rotate(tenant=tenant_a, actor="user:a"))

    assert sum(isinstance(r, tuple) for r in results) == 1
    assert sum(isinstance(r, RotationInProgress) for r in results) == 3
    assert len(_active_prefixes(tenant_a)) == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_revocations_of_both_active_secrets_keep_one(tenant_a):
    old, _ = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    new, _ = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    ids = [old.id, new.id]

    results = run_at_once(
        2, lambda i: signing_secret_revoke(tenant=tenant_a, secret_id=ids[i], actor="user:a")
    )

    assert sum(isinstance(r, LastSigningSecret) for r in results) == 1
    assert len(_active_prefixes(tenant_a)) == 1


def test_reencrypt_moves_every_secret_to_the_first_key(tenant_a, tenant_b, settings):
    from io import StringIO

    from django.core.management import call_command

    _, raw_a = signing_secret_rotate(tenant=tenant_a, actor="user:alice")  # derived key
    settings.TICK_SIGNING_KEYS = [Fernet.generate_key().decode()]
    _, raw_b = signing_secret_rotate(tenant=tenant_b, actor="user:charlie")
    new_key = Fernet.generate_key().decode()
    settings.TICK_SIGNING_KEYS = [new_key, settings.TICK_SIGNING_KEYS[0]]
    out = StringIO()

    call_command("signing_keys_reencrypt", stdout=out)

    # only the new key (and no SECRET_KEY-derived one) is left, and both secrets still read
    settings.TICK_SIGNING_KEYS = [new_key]
    settings.SECRET_KEY = "another-secret-key-entirely"
    now = timezone.now()
    assert signing_keys_for_send(tenant_id=tenant_a.id, now=now) == [base64.b64decode(raw_a[6:])]
    assert signing_keys_for_send(tenant_id=tenant_b.id, now=now) == [base64.b64decode(raw_b[6:])]
    assert out.getvalue().strip() == "re-encrypted 2 signing secrets"
