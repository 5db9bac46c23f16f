"""Alert channels and rules for tests, and a local webhook receiver that records requests."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from django.utils import timezone

from apps.occurrences.alerts.configure import ChannelSpec, RuleSpec, channel_create, rule_create
from apps.occurrences.execution.run import occurrence_execute
from apps.occurrences.models import AlertChannel, AlertEvent, AlertRule, DispatchOutbox, Occurrence
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.tests.support.pipeline import leases, materialize_config
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant


def channel(tenant: Tenant, target: str, kind: str = AlertChannel.Kind.EMAIL) -> AlertChannel:
    if kind == AlertChannel.Kind.WEBHOOK:  # a local receiver's port, opened for the tenant
        port = urlsplit(target).port
        if port and port not in tenant.webhook_allowed_ports:
            tenant.webhook_allowed_ports = [*tenant.webhook_allowed_ports, port]
            tenant.save(update_fields=["webhook_allowed_ports"])
    made = channel_create(
        tenant=tenant, spec=ChannelSpec(name=target[:100], kind=kind, target=target), actor="t"
    )
    # As if the address had followed its confirmation link (test_confirmation.py does).
    AlertChannel.objects.filter(id=made.id).update(confirmed_at=timezone.now())
    made.refresh_from_db()
    return made


def rule(ch: AlertChannel, event: str = AlertEvent.OCCURRENCE_DEAD, **fields: Any) -> AlertRule:
    return rule_create(
        tenant=ch.tenant, spec=RuleSpec(channel_id=ch.id, event=event, **fields), actor="t"
    )


class Receiver(BaseHTTPRequestHandler):
    """Records each POST; answers 200 unless the server's `hold` event is set, in which case
    it waits (a receiver that is slow while the test kills the sender)."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        server: Any = self.server
        server.requests.append({"headers": dict(self.headers), "json": json.loads(body)})
        server.arrived.set()
        if server.hold.is_set():
            server.release.wait(30)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass


def receiver() -> Iterator[Any]:
    httpd: Any = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    httpd.requests = []
    httpd.arrived, httpd.hold, httpd.release = (
        threading.Event(),
        threading.Event(),
        threading.Event(),
    )
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    yield httpd
    httpd.release.set()
    httpd.shutdown()
    httpd.server_close()


def dead_occurrence(tenant: Tenant, **schedule_fields: Any) -> Occurrence:
    """An occurrence the worker path sends DEAD (its handler fails permanently)."""
    run_at = timezone.now() - timedelta(seconds=1)
    one_shot = make_schedule(
        tenant, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at, next_run_at=run_at,
        payload={"fail": "permanent"}, **schedule_fields,
    )  # fmt: skip
    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())
    DispatchOutbox.objects.all().delete()
    # Only this schedule's row: near the top of an hour the pass also writes the next instant
    # of a test's hourly schedule.
    occ = Occurrence.objects.filter(schedule_id=one_shot.id, state=Occurrence.State.SCHEDULED).get()
    occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w1")
    occ.refresh_from_db()
    assert occ.state == Occurrence.State.DEAD
    return occ
