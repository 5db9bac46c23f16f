"""Signed webhooks through the worker path (claim, run, complete) to a local receiver, checked
by a verifier written here from the Standard Webhooks spec with the standard library only —
not by Tick's signing module — as a receiver would (docs/webhooks.md)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.utils import timezone

from apps.occurrences.execution.run import occurrence_execute
from apps.occurrences.execution.webhook import WebhookPayloadError, validate_webhook_payload
from apps.occurrences.models import Occurrence
from apps.occurrences.tests.support.rows import occurrence, schedule, state_of
from apps.tenants.models import SigningSecret
from apps.tenants.signing import signing_secret_rotate

TOLERANCE_S = 300


def verify(secret: str, headers: dict[str, str], body: bytes, *, now: float) -> bool:
    """A receiver's check: fresh timestamp, and one `v1` signature equal to
    base64(HMAC-SHA256(base64-decoded secret, "<id>.<timestamp>.<body>"))."""
    msg_id, stamp = headers["webhook-id"], headers["webhook-timestamp"]
    if abs(now - int(stamp)) > TOLERANCE_S:
        return False
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, msg_id.encode() + b"." + stamp.encode() + b"." + body, hashlib.sha256)
    expected = base64.b64encode(mac.digest()).decode()
    for candidate in headers["webhook-signature"].split():
        version, _, sig = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(sig, expected):
            return True
    return False


class _Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        server: Any = self.server
        server.calls.append(({name.lower(): value for name, value in self.headers.items()}, body))
        status = server.statuses.pop(0) if server.statuses else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def receiver(settings: Any) -> Iterator[Any]:
    settings.TICK_WEBHOOK_ALLOWLIST = ["127.0.0.1/32"]
    httpd: Any = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    httpd.calls, httpd.statuses = [], []
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _run_webhook(tenant, receiver, body: Any) -> Occurrence:
    url = f"http://127.0.0.1:{receiver.server_port}/hook"
    if receiver.server_port not in tenant.webhook_allowed_ports:  # the test server's port
        tenant.webhook_allowed_ports = [*tenant.webhook_allowed_ports, receiver.server_port]
        tenant.save(update_fields=["webhook_allowed_ports"])
    occ = occurrence(schedule(tenant, handler="webhook", payload={"url": url, "body": body}),
                     timezone.now())  # fmt: skip
    occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w")
    return occ


@pytest.mark.django_db
def test_a_webhook_call_verifies_and_tampering_or_a_stale_timestamp_fails(receiver, tenant_a):
    _, secret = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    body = {"city": "Zürich", "emoji": "✓", "n": [1, 2.5, None]}

    occ = _run_webhook(tenant_a, receiver, body)

    assert state_of(occ) == Occurrence.State.SUCCEEDED
    [(headers, raw)] = receiver.calls
    now = time.time()
    assert json.loads(raw) == body
    assert abs(int(headers["webhook-timestamp"]) - now) < 60
    assert verify(secret, headers, raw, now=now)
    # a changed byte of the body, another secret, a stale or a forged timestamp: refused
    assert not verify(secret, headers, raw.replace(b"2.5", b"3.5"), now=now)
    assert not verify(secret, headers, raw + b" ", now=now)
    _, other = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    assert not verify(other, headers, raw, now=now)
    assert not verify(secret, headers, raw, now=now + TOLERANCE_S + 5)
    forged = {**headers, "webhook-timestamp": str(int(now) + 10)}
    assert not verify(secret, forged, raw, now=now)


@pytest.mark.django_db
def test_during_a_rotation_both_signatures_are_sent_and_each_verifies(receiver, tenant_a):
    _, old = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    _, new = signing_secret_rotate(tenant=tenant_a, actor="user:alice")

    _run_webhook(tenant_a, receiver, {"k": 1})

    [(headers, raw)] = receiver.calls
    parts = headers["webhook-signature"].split(" ")
    assert len(parts) == 2 and all(p.startswith("v1,") for p in parts)
    now = time.time()
    for secret in (old, new):
        assert verify(secret, headers, raw, now=now)
        # each secret matches exactly one of the two signatures
        alone = [verify(secret, {**headers, "webhook-signature": p}, raw, now=now) for p in parts]
        assert sorted(alone) == [False, True]


@pytest.mark.django_db
def test_after_the_previous_secret_is_revoked_only_the_new_one_verifies(receiver, tenant_a):
    from apps.tenants.signing import signing_secret_revoke

    old_row, old = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    _, new = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    signing_secret_revoke(tenant=tenant_a, secret_id=old_row.id, actor="user:alice")

    _run_webhook(tenant_a, receiver, {})

    [(headers, raw)] = receiver.calls
    assert len(headers["webhook-signature"].split()) == 1
    assert verify(new, headers, raw, now=time.time())
    assert not verify(old, headers, raw, now=time.time())


@pytest.mark.django_db
def test_the_idempotency_headers_are_the_occurrence_id_on_every_retry(receiver, tenant_a):
    _, secret = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    receiver.statuses = [503]

    occ = _run_webhook(tenant_a, receiver, {"run": "nightly"})
    assert state_of(occ) == Occurrence.State.RETRY_WAIT
    occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w2")

    assert state_of(occ) == Occurrence.State.SUCCEEDED
    assert len(receiver.calls) == 2
    for headers, raw in receiver.calls:
        assert headers["idempotency-key"] == headers["webhook-id"] == str(occ.id)
        assert verify(secret, headers, raw, now=time.time())


@pytest.mark.django_db
def test_a_tenant_without_a_secret_gets_one_and_its_calls_are_signed(receiver, tenant_a):
    assert not SigningSecret.objects.filter(tenant=tenant_a).exists()

    _run_webhook(tenant_a, receiver, {})
    _run_webhook(tenant_a, receiver, {})

    assert SigningSecret.objects.filter(tenant=tenant_a).count() == 1
    signatures = [headers["webhook-signature"] for headers, _ in receiver.calls]
    assert len(signatures) == 2 and all(s.startswith("v1,") for s in signatures)


@pytest.mark.parametrize("name", ["webhook-signature", "Webhook-Id", "WEBHOOK-TIMESTAMP"])
def test_tenants_cannot_set_the_signature_headers(name, settings):
    settings.TICK_WEBHOOK_ALLOWLIST = []
    payload = {"url": "https://example.com/hook", "headers": {name: "v1,forged"}}

    with pytest.raises(WebhookPayloadError) as excinfo:
        validate_webhook_payload(payload)

    assert excinfo.value.field == "headers"


@pytest.mark.django_db
def test_the_standard_webhooks_reference_library_accepts_the_call(receiver, tenant_a):
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError

    _, old = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    _, new = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    body = {"city": "Zürich", "n": 1}

    _run_webhook(tenant_a, receiver, body)

    [(headers, raw)] = receiver.calls
    assert Webhook(old).verify(raw, headers) == body
    assert Webhook(new).verify(raw, headers) == body
    with pytest.raises(WebhookVerificationError):
        Webhook(new).verify(raw.replace(b"1", b"2"), headers)


def _documented_verifier() -> Any:
    """The Python block of docs/webhooks.md, run as a receiver would paste it."""
    from django.conf import settings

    text = (settings.BASE_DIR / "docs" / "webhooks.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/webhooks.md", "exec"), namespace)  # noqa: S102 - our own docs
    return namespace["verify_webhook"]


@pytest.mark.django_db
def test_the_verifier_in_the_docs_accepts_the_call_and_refuses_a_tampered_one(receiver, tenant_a):
    verify_webhook = _documented_verifier()
    _, secret = signing_secret_rotate(tenant=tenant_a, actor="user:alice")

    _run_webhook(tenant_a, receiver, {"k": "v"})

    [(headers, raw)] = receiver.calls
    assert verify_webhook(secret, headers, raw) is True
    assert verify_webhook(secret, headers, raw.replace(b'"v"', b'"w"')) is False
    stale = {**headers, "webhook-timestamp": str(int(headers["webhook-timestamp"]) - 600)}
    assert verify_webhook(secret, stale, raw) is False


def _context_run(tenant, receiver, payload: dict[str, Any], *, origin: str, statuses=()) -> Any:
    """A webhook occurrence of `origin` at a whole second two minutes ago, run once."""
    url = f"http://127.0.0.1:{receiver.server_port}/hook"
    tenant.webhook_allowed_ports = [receiver.server_port]
    tenant.save(update_fields=["webhook_allowed_ports"])
    sched = schedule(tenant, handler="webhook", payload={"url": url, **payload})
    instant = (timezone.now() - timedelta(minutes=2)).replace(microsecond=123000)
    occ = occurrence(sched, instant)
    Occurrence.objects.filter(id=occ.id).update(origin=origin)
    receiver.statuses = list(statuses)
    occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w")
    return sched, occ


def _stamp(instant: datetime) -> str:
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.123000Z")


@pytest.mark.django_db
def test_a_receiver_verifies_the_call_and_reads_its_run_context_headers(receiver, tenant_a):
    _, secret = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    sched, occ = _context_run(
        tenant_a, receiver, {"body": {"report": "daily"}},
        origin=Occurrence.Origin.BACKFILL, statuses=[503],
    )  # fmt: skip
    occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w2")

    assert state_of(occ) == Occurrence.State.SUCCEEDED
    assert [h["tick-attempt"] for h, _ in receiver.calls] == ["1", "2"]
    for headers, raw in receiver.calls:
        assert verify(secret, headers, raw, now=time.time())
        assert json.loads(raw) == {"report": "daily"}  # without the envelope: the body as given
        assert headers["tick-scheduled-for"] == _stamp(occ.scheduled_for)
        assert datetime.fromisoformat(headers["tick-scheduled-for"]) == occ.scheduled_for
        assert headers["tick-schedule-id"] == str(sched.id)
        assert headers["tick-schedule-version"] == str(sched.version)
        assert headers["tick-origin"] == "backfill"


@pytest.mark.django_db
def test_the_envelope_carries_the_context_inside_the_signed_body(receiver, tenant_a):
    from standardwebhooks.webhooks import Webhook

    _, secret = signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    sched, occ = _context_run(
        tenant_a, receiver, {"body": {"n": [1, 2]}, "envelope": True},
        origin=Occurrence.Origin.MANUAL,
    )  # fmt: skip

    [(headers, raw)] = receiver.calls
    assert Webhook(secret).verify(raw, headers) == {
        "context": {
            "occurrence_id": str(occ.id),
            "scheduled_for": _stamp(occ.scheduled_for),
            "attempt": 1,
            "schedule_id": str(sched.id),
            "schedule_version": sched.version,
            "origin": "manual",
        },
        "payload": {"n": [1, 2]},
    }
    assert headers["tick-origin"] == "manual"
    # a receiver trusting only the signed bytes sees a changed context refused
    assert not verify(secret, headers, raw.replace(b'"manual"', b'"scheduled"'), now=time.time())


@pytest.mark.django_db
def test_a_run_replayed_from_the_dlq_says_replay_and_counts_its_attempts_on(receiver, tenant_a):
    from apps.occurrences.execution.replay import occurrences_replay

    _, occ = _context_run(tenant_a, receiver, {}, origin=Occurrence.Origin.SCHEDULED,
                          statuses=[410])  # fmt: skip
    assert state_of(occ) == Occurrence.State.DEAD

    assert occurrences_replay(tenant_id=tenant_a.id, occurrence_ids=[occ.id]).replayed == [occ.id]
    occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w2")

    assert state_of(occ) == Occurrence.State.SUCCEEDED
    origins = [(h["tick-origin"], h["tick-attempt"]) for h, _ in receiver.calls]
    assert origins == [("scheduled", "1"), ("replay", "2")]


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"headers": {"tick-origin": "manual"}}, "headers"),
        ({"headers": {"Tick-Scheduled-For": "2020-01-01T00:00:00Z"}}, "headers"),
        ({"envelope": "yes"}, "envelope"),
    ],
)
def test_tenants_cannot_forge_the_context_headers_and_envelope_is_a_boolean(
    payload, field, settings
):
    settings.TICK_WEBHOOK_ALLOWLIST = []

    with pytest.raises(WebhookPayloadError) as excinfo:
        validate_webhook_payload({"url": "https://example.com/hook", **payload})

    assert excinfo.value.field == field
