"""Alerts end to end inside one process: recorded with the state change they report, grouped
per channel (coalesced, rate-limited into digests), sent at least once with a stable id."""

from __future__ import annotations

import uuid
from datetime import timedelta
from email import message_from_bytes
from email import policy as email_policy

import pytest
from django.core import mail
from django.db import connection
from django.utils import timezone

from apps.occurrences.alert_records import record_dead_alert
from apps.occurrences.alerts.configure import (
    AlertConfigError,
    ChannelSpec,
    channel_create,
    send_test_alert,
)
from apps.occurrences.alerts.deliver import ALERT_ID_HEADER, alert_deliver
from apps.occurrences.alerts.dispatch import group_pending, publish_pending
from apps.occurrences.alerts.lag import lag_alerts_record
from apps.occurrences.alerts.tests.support import channel, dead_occurrence, receiver, rule
from apps.occurrences.execution.reaper import attempts_reap
from apps.occurrences.models import (
    Alert,
    AlertChannel,
    AlertDelivery,
    AlertEvent,
    Attempt,
    Lane,
    Occurrence,
    occurrence_id_for,
)
from apps.occurrences.pipeline.materializer import materialize_pass
from apps.occurrences.pipeline.partitions import partitions_ensure
from apps.occurrences.tests.support.pipeline import leases, materialize_config
from apps.occurrences.tests.support.rows import occurrence, schedule
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule

pytestmark = [pytest.mark.django_db, pytest.mark.clock_edge]


@pytest.fixture
def allow_loopback(settings):
    settings.TICK_WEBHOOK_ALLOWLIST = ["127.0.0.1/32"]


@pytest.fixture
def hook(allow_loopback):
    yield from receiver()


def _hook_url(server) -> str:
    return f"http://127.0.0.1:{server.server_port}/alerts"


def _group_later(seconds: float = 11) -> tuple[int, int]:
    return group_pending(now=timezone.now() + timedelta(seconds=seconds), coalesce_s=10,
                         interval_s=60)  # fmt: skip


def test_a_dead_occurrence_records_one_alert_per_channel_of_its_tenant(tenant_a, tenant_b, hook):
    by_mail = channel(tenant_a, "ops@example.com")
    by_hook = channel(tenant_a, _hook_url(hook), AlertChannel.Kind.WEBHOOK)
    rule(by_mail)
    rule(by_hook)
    rule(channel(tenant_b, "other@example.com"))

    occ = dead_occurrence(tenant_a)

    alerts = Alert.objects.filter(occurrence_id=occ.id)
    assert {a.channel_id for a in alerts} == {by_mail.id, by_hook.id}
    assert all(a.event == AlertEvent.OCCURRENCE_DEAD for a in alerts)
    assert "DEAD" in alerts[0].subject
    assert not Alert.objects.filter(tenant=tenant_b).exists()
    # Recording the same event again (a redelivered completion) stores nothing new.
    with connection.cursor() as cursor:
        again = record_dead_alert(cursor, occurrence_id=occ.id, scheduled_for=occ.scheduled_for,
                                  schedule_id=occ.schedule_id, tenant_id=tenant_a.id)  # fmt: skip
    assert again == 0 and Alert.objects.count() == 2


def test_disabled_rules_channels_and_other_schedules_record_nothing(tenant_a):
    rule(channel(tenant_a, "a@example.com"), enabled=False)
    off = channel(tenant_a, "b@example.com")
    rule(off)
    AlertChannel.objects.filter(id=off.id).update(enabled=False)
    rule(channel(tenant_a, "c@example.com"), schedule_id=schedule(tenant_a).id)

    dead_occurrence(tenant_a)

    assert not Alert.objects.exists()


def test_a_rule_for_one_schedule_fires_for_that_schedule(tenant_a):
    ch = channel(tenant_a, "a@example.com")
    occ = dead_occurrence(tenant_a)
    rule(ch, schedule_id=occ.schedule_id)
    with connection.cursor() as cursor:
        recorded = record_dead_alert(
            cursor, occurrence_id=occ.id, scheduled_for=occ.scheduled_for,
            schedule_id=occ.schedule_id, tenant_id=tenant_a.id,
        )  # fmt: skip
    assert recorded == 1


def test_an_alert_waits_for_company_then_is_mailed_once_with_its_id(tenant_a):
    rule(channel(tenant_a, "ops@example.com"))
    dead_occurrence(tenant_a)

    assert group_pending(now=timezone.now(), coalesce_s=10, interval_s=60) == (0, 0)
    assert _group_later() == (1, 1)
    delivery = AlertDelivery.objects.get()

    assert alert_deliver(delivery.id) == AlertDelivery.State.SENT
    assert alert_deliver(delivery.id) == AlertDelivery.State.SENT  # a redelivered message
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["ops@example.com"]
    assert message.extra_headers[ALERT_ID_HEADER] == str(delivery.id)
    assert "DEAD" in message.subject and "alpha" in message.subject


def _running_past_deadline(tenant, count: int) -> None:
    """`count` RUNNING occurrences whose worker died after their retry deadline passed."""
    sched = schedule(tenant)
    now = timezone.now()
    partitions_ensure([(now - timedelta(hours=1)).date(), now.date()])
    instants = [now - timedelta(minutes=30, seconds=n) for n in range(count)]
    Occurrence.objects.bulk_create([
        Occurrence(id=occurrence_id_for(sched.id, sched.version, t), scheduled_for=t,
                   schedule=sched, schedule_version=sched.version, tenant_id=tenant.id,
                   lane=Lane.STRICT, state=Occurrence.State.RUNNING, available_at=t,
                   created_at=now, attempt_count=1, deadline_at=now - timedelta(seconds=1))
        for t in instants
    ])  # fmt: skip
    Attempt.objects.bulk_create([
        Attempt(scheduled_for=t, occurrence_id=occurrence_id_for(sched.id, sched.version, t),
                tenant_id=tenant.id, attempt_no=1, lease_token=uuid.uuid4(),
                lease_expires_at=now - timedelta(minutes=1), worker_id="lost", started_at=t)
        for t in instants
    ])  # fmt: skip


def test_a_thousand_dead_in_a_minute_make_one_digest(tenant_a):
    rule(channel(tenant_a, "ops@example.com"))
    _running_past_deadline(tenant_a, 1000)

    reaped = attempts_reap(now=timezone.now(), grace_s=0, limit=1000)

    assert reaped.dead == 1000
    assert Alert.objects.count() == 1000
    assert _group_later() == (1, 1000)
    delivery = AlertDelivery.objects.get()
    alert_deliver(delivery.id)
    assert len(mail.outbox) == 1
    digest = mail.outbox[0]
    assert "1000 alerts (1000 dead" in digest.subject
    assert digest.body.count("DEAD: ") == 50
    assert "… and 950 more" in digest.body

    # One more right after: it waits for the channel's interval (60 s from the digest, sent
    # at +11 s), then goes alone.
    dead_occurrence(tenant_a)
    assert _group_later(20) == (0, 0)
    assert _group_later(75) == (1, 1)


def test_a_webhook_channel_receives_the_digest_as_json(tenant_a, hook):
    ch = channel(tenant_a, _hook_url(hook), AlertChannel.Kind.WEBHOOK)
    rule(ch)
    occ = dead_occurrence(tenant_a)
    _group_later()
    delivery = AlertDelivery.objects.get()

    assert alert_deliver(delivery.id) == AlertDelivery.State.SENT

    [request] = hook.requests
    assert request["headers"][ALERT_ID_HEADER] == str(delivery.id)
    document = request["json"]
    assert document["alert_id"] == str(delivery.id) and document["count"] == 1
    assert document["alerts"][0]["occurrence_id"] == str(occ.id)
    assert document["alerts"][0]["event"] == AlertEvent.OCCURRENCE_DEAD


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:9/x", "http://10.0.0.5/x", "http://[::1]/x", "http://169.254.169.254/"],
)
def test_an_alert_webhook_to_a_private_address_is_refused(tenant_a, settings, url):
    settings.TICK_WEBHOOK_ALLOWLIST = []
    with pytest.raises(AlertConfigError) as refused:
        channel_create(tenant=tenant_a, spec=ChannelSpec("x", AlertChannel.Kind.WEBHOOK, url),
                       actor="t")  # fmt: skip
    assert "target" in refused.value.fields
    assert not AlertChannel.objects.exists()


def test_a_target_refused_at_send_time_fails_at_once(tenant_a, hook, settings):
    ch = channel(tenant_a, _hook_url(hook), AlertChannel.Kind.WEBHOOK)
    send_test_alert(channel=ch, actor="t")
    _group_later()
    settings.TICK_WEBHOOK_ALLOWLIST = []  # the operator closed loopback since

    assert alert_deliver(AlertDelivery.objects.get().id) == AlertDelivery.State.FAILED
    assert not hook.requests
    assert "refused" in AlertDelivery.objects.get().last_error


def test_a_transient_failure_backs_off_then_fails_after_the_last_attempt(
    tenant_a, allow_loopback, settings
):
    settings.TICK_ALERT_MAX_ATTEMPTS = 2
    ch = channel(tenant_a, "http://127.0.0.1:9/closed", AlertChannel.Kind.WEBHOOK)
    send_test_alert(channel=ch, actor="t")
    _group_later()
    delivery = AlertDelivery.objects.get()
    AlertDelivery.objects.filter(id=delivery.id).update(published_at=timezone.now())

    assert alert_deliver(delivery.id) == AlertDelivery.State.PENDING
    delivery.refresh_from_db()
    assert delivery.published_at is None  # the dispatcher publishes it again …
    assert delivery.available_at > timezone.now()  # … after a back-off
    assert delivery.last_error
    assert alert_deliver(delivery.id) == AlertDelivery.State.FAILED


def test_a_test_alert_waits_for_the_coalescing_and_the_channel_interval(tenant_a):
    ch = channel(tenant_a, "ops@example.com")
    sent_at = timezone.now()
    AlertChannel.objects.filter(id=ch.id).update(last_sent_at=sent_at)
    for _ in range(3):  # the button pressed in a loop
        send_test_alert(channel=ch, actor="alice")

    assert group_pending(now=sent_at + timedelta(seconds=11), coalesce_s=10,
                         interval_s=60) == (0, 0)  # fmt: skip
    assert group_pending(now=sent_at + timedelta(seconds=61), coalesce_s=10,
                         interval_s=60) == (1, 3)  # fmt: skip
    alert_deliver(AlertDelivery.objects.get().id)
    assert len(mail.outbox) == 1  # one digest, not three mails
    assert "3 alerts (3 test)" in mail.outbox[0].subject


def test_missed_and_completed_schedules_alert(tenant_a):
    ch = channel(tenant_a, "ops@example.com")
    rule(ch, AlertEvent.OCCURRENCE_MISSED)
    rule(ch, AlertEvent.SCHEDULE_COMPLETED)
    run_at = timezone.now() - timedelta(hours=1)
    sched = make_schedule(tenant_a, kind=Schedule.Kind.ONE_SHOT, expression="", run_at=run_at,
                          next_run_at=run_at, misfire_policy=Schedule.MisfirePolicy.SKIP,
                          max_lateness_s=60)  # fmt: skip

    materialize_pass(leases=leases(), now=timezone.now(), config=materialize_config())

    events = {a.event: a for a in Alert.objects.filter(schedule_id=sched.id)}
    assert set(events) == {AlertEvent.OCCURRENCE_MISSED, AlertEvent.SCHEDULE_COMPLETED}
    assert "missed 1 run(s)" in events[AlertEvent.OCCURRENCE_MISSED].subject


def test_a_lag_rule_fires_once_per_window_while_the_lag_lasts(tenant_a):
    ch = channel(tenant_a, "ops@example.com")
    lag = rule(ch, AlertEvent.START_LAG, threshold_s=30, window_minutes=3)
    sched = schedule(tenant_a)
    now = timezone.now()
    minute = now.replace(second=0, microsecond=0)
    for n in range(1, 4):  # due in each of the last 3 whole minutes, none started yet
        occurrence(sched, minute - timedelta(minutes=n) + timedelta(seconds=1))

    assert lag_alerts_record(now=now) == 1
    assert lag_alerts_record(now=now + timedelta(seconds=5)) == 0
    alert = Alert.objects.get(rule=lag)
    assert alert.subject.startswith("START LAG: p95 above 30 s for 3 min")


def test_a_lag_rule_stays_quiet_when_runs_start_on_time(tenant_a):
    rule(channel(tenant_a, "ops@example.com"), AlertEvent.START_LAG, threshold_s=30,
         window_minutes=3)  # fmt: skip
    sched = schedule(tenant_a)
    now = timezone.now()
    minute = now.replace(second=0, microsecond=0)
    for n in range(1, 4):
        at = minute - timedelta(minutes=n)
        occ = occurrence(sched, at, state=Occurrence.State.SUCCEEDED)
        Attempt.objects.create(
            scheduled_for=at, occurrence_id=occ.id, tenant_id=tenant_a.id, attempt_no=1,
            lease_token=uuid.uuid4(), lease_expires_at=at, worker_id="w",
            started_at=at + timedelta(seconds=2), finished_at=at + timedelta(seconds=3),
            outcome=Attempt.Outcome.SUCCEEDED,
        )  # fmt: skip

    assert lag_alerts_record(now=now) == 0


def test_a_tenants_alert_sends_are_capped_and_a_waiting_message_spends_no_attempt(
    tenant_a, tenant_b, settings
):
    settings.TICK_ALERT_TENANT_SENDS = 1
    busy, waiting = channel(tenant_a, "a1@example.com"), channel(tenant_a, "a2@example.com")
    other = channel(tenant_b, "b@example.com")
    for ch in (busy, waiting, other):
        send_test_alert(channel=ch, actor="t")
    _group_later()
    now = timezone.now()
    # A worker is sending tenant A's first message (a receiver that takes its time).
    AlertDelivery.objects.filter(channel=busy).update(
        sending_until=now + timedelta(seconds=60), attempts=1
    )
    AlertDelivery.objects.update(published_at=now)

    held = AlertDelivery.objects.get(channel=waiting)
    assert alert_deliver(held.id) == AlertDelivery.State.PENDING
    held.refresh_from_db()
    assert (held.attempts, held.published_at) == (0, None)  # back to the dispatcher, unspent
    assert now < held.available_at <= timezone.now() + timedelta(seconds=5)
    assert not mail.outbox
    # Another tenant's message is not held up by tenant A's.
    assert alert_deliver(AlertDelivery.objects.get(channel=other).id) == AlertDelivery.State.SENT

    # The first send's lease ends (its worker died): the waiting message goes.
    AlertDelivery.objects.filter(channel=busy).update(sending_until=now - timedelta(seconds=1))
    assert alert_deliver(held.id) == AlertDelivery.State.SENT
    held.refresh_from_db()
    assert (held.attempts, held.sending_until) == (1, None)
    assert [m.to for m in mail.outbox] == [["b@example.com"], ["a2@example.com"]]


def test_a_second_copy_of_a_message_being_sent_waits_for_that_send(tenant_a, settings):
    # Room for another send of the tenant: only the copy's own lease holds it.
    settings.TICK_ALERT_TENANT_SENDS = 2
    send_test_alert(channel=channel(tenant_a, "ops@example.com"), actor="t")
    _group_later()
    now = timezone.now()
    # A worker is sending this message; a republished copy reaches another worker.
    AlertDelivery.objects.update(sending_until=now + timedelta(seconds=60), attempts=1,
                                 published_at=now)  # fmt: skip
    copy = AlertDelivery.objects.get()

    assert alert_deliver(copy.id) == AlertDelivery.State.PENDING
    copy.refresh_from_db()
    assert (copy.attempts, copy.published_at) == (1, None)  # not sent again, no attempt spent
    assert now < copy.available_at <= timezone.now() + timedelta(seconds=5)
    assert not mail.outbox

    # The sending worker died: once its lease ends, the copy is sent.
    AlertDelivery.objects.update(sending_until=now - timedelta(seconds=1))
    assert alert_deliver(copy.id) == AlertDelivery.State.SENT
    assert [m.to for m in mail.outbox] == [["ops@example.com"]]


def test_a_message_a_worker_begins_sending_before_its_confirm_is_recorded_is_published_once(
    tenant_a, publisher
):
    send_test_alert(channel=channel(tenant_a, "ops@example.com"), actor="t")
    _group_later()
    publish = publisher.publish

    def publish_then_a_worker_starts_sending(messages):
        result = publish(messages)  # the real broker confirms ...
        # ... and a worker takes the message and begins its send before the pass records it.
        AlertDelivery.objects.update(
            attempts=1, sending_until=timezone.now() + timedelta(seconds=60)
        )
        return result

    publisher.publish = publish_then_a_worker_starts_sending
    later = timezone.now() + timedelta(seconds=11)
    assert publish_pending(now=later, publisher=publisher) == 1
    publisher.publish = publish
    # The next pass has nothing to publish: no second copy beside the send under way.
    assert publish_pending(now=later + timedelta(seconds=1), publisher=publisher) == 0
    assert AlertDelivery.objects.get().published_at is not None


def test_a_line_break_in_a_schedule_name_breaks_no_header_and_adds_no_line(tenant_a):
    # A row saved before names were checked for control characters.
    ch = channel(tenant_a, "ops@example.com")
    rule(ch)
    evil = "nightly\r\nBcc: evil@example.test\u2028X-Other: 1"
    first = dead_occurrence(tenant_a)
    Schedule.objects.filter(id=first.schedule_id).update(name=evil)
    Alert.objects.all().delete()
    with connection.cursor() as cursor:  # the DEAD alert as the worker records it
        record_dead_alert(cursor, occurrence_id=first.id, scheduled_for=first.scheduled_for,
                          schedule_id=first.schedule_id, tenant_id=tenant_a.id)  # fmt: skip
    _group_later()
    assert alert_deliver(AlertDelivery.objects.get().id) == AlertDelivery.State.SENT
    alone = mail.outbox[0]
    assert "\n" not in alone.subject and "\r" not in alone.subject
    assert "DEAD: nightly  Bcc: evil@example.test X-Other: 1" in alone.subject
    sent = message_from_bytes(alone.message().as_bytes(), policy=email_policy.default)
    assert (sent["Bcc"], sent["X-Other"]) == (None, None)
    assert str(sent["Subject"]) == alone.subject

    # In a digest, each alert stays on its one line.
    for n in range(2):
        send_test_alert(channel=ch, actor=f"a\nb{n}")
    Alert.objects.filter(event=AlertEvent.TEST).update(subject=f"{evil} #test")
    group_pending(now=timezone.now() + timedelta(seconds=120), coalesce_s=10, interval_s=60)
    digest = AlertDelivery.objects.filter(state=AlertDelivery.State.PENDING).get()
    assert alert_deliver(digest.id) == AlertDelivery.State.SENT
    body = mail.outbox[1].body.splitlines()
    assert not [line for line in body if line.startswith(("Bcc", "X-Other"))]
    assert len([line for line in body if "Bcc: evil" in line]) == 2
