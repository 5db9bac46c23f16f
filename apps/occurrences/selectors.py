"""Tenant-scoped reads of occurrences and their attempts, and the one parser of the
occurrence list filters (API, web pages; usable by the admin browser on any queryset), and
the "next run" and next fires a schedule shows."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import (
    BooleanField,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Window,
)
from django.db.models.functions import RowNumber
from django.http import Http404, QueryDict
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from apps.occurrences.models import Attempt, Lane, Occurrence
from apps.schedules.models import Schedule
from apps.schedules.services import rule_times_from
from apps.tenants.models import Tenant


def occurrences_for(*, tenant: Tenant) -> QuerySet[Occurrence]:
    return Occurrence.objects.filter(tenant=tenant)


def with_first_start(queryset: QuerySet[Occurrence]) -> QuerySet[Occurrence]:
    """The occurrences with `first_started_at`: the start of their attempt 1 (None before
    it), read by a correlated subquery on the attempt's unique key (occurrence_id,
    scheduled_for, attempt_no) inside the same query — one index probe per row of the page,
    never a query per row. Attempt has no foreign key to join through."""
    first = Attempt.objects.filter(
        occurrence_id=OuterRef("id"), scheduled_for=OuterRef("scheduled_for"), attempt_no=1
    ).values("started_at")[:1]
    return queryset.annotate(first_started_at=Subquery(first))


def access_occurrence(*, tenant: Tenant, occurrence_id: uuid.UUID | str) -> Occurrence:
    """The tenant's occurrence (with `first_started_at`), or 404 — also for another
    tenant's id, and for an id that is no UUID (parsed before the query)."""
    try:
        parsed = occurrence_id if isinstance(occurrence_id, uuid.UUID) else uuid.UUID(occurrence_id)
    except (ValueError, TypeError, AttributeError):
        raise Http404("No such occurrence.") from None
    occurrence = with_first_start(occurrences_for(tenant=tenant)).filter(id=parsed).first()
    if occurrence is None:
        raise Http404("No such occurrence.")
    return occurrence


def attempts_of(occurrence: Occurrence) -> QuerySet[Attempt]:
    return Attempt.objects.filter(
        occurrence_id=occurrence.id,
        scheduled_for=occurrence.scheduled_for,
        tenant_id=occurrence.tenant_id,
    ).order_by("attempt_no")


# The instant a lane's lag counts from: a strict or catch-up occurrence is due at its instant
# (`scheduled_for`), a flexible one — and a retry-lane outbox row — when it became due
# (`available_at`). The relay's enqueue lag, the claim's start lag, the API, the pages and the
# dashboard's SQL all read this one rule.
LAG_FROM_AVAILABLE_AT: tuple[Lane, ...] = (Lane.FLEXIBLE, Lane.RETRY)


def lag_reference(lane: str, *, scheduled_for: datetime, available_at: datetime) -> datetime:
    return available_at if lane in LAG_FROM_AVAILABLE_AT else scheduled_for


def _lag_s(occurrence: Occurrence, at: datetime | None) -> float | None:
    if at is None:
        return None
    if occurrence.origin != Occurrence.Origin.SCHEDULED:
        # Run now and backfill are due when asked for (their `available_at`), not at their
        # instant: a backfilled instant is past by design (docs/ui.md "Asked-for runs are
        # never late").
        return round((at - occurrence.available_at).total_seconds(), 3)
    due = lag_reference(
        occurrence.lane,
        scheduled_for=occurrence.scheduled_for,
        available_at=occurrence.available_at,
    )
    return round((at - due).total_seconds(), 3)


def enqueue_lag_s(occurrence: Occurrence) -> float | None:
    """enqueued_at - the lane's lag reference (`lag_reference`), seconds; None before the
    first broker confirm."""
    return _lag_s(occurrence, occurrence.enqueued_at)


def start_lag_s(occurrence: Occurrence) -> float | None:
    """The first attempt's started_at - the lane's lag reference, seconds: how late the
    handler started, as the tenant feels it (quota and overlap delays included); None before
    the first attempt. The occurrence must come through `with_first_start` (the list reads
    and `access_occurrence` do); a later attempt is a retry, late by design."""
    started_at: datetime | None = vars(occurrence)["first_started_at"]
    return _lag_s(occurrence, started_at)


class OccurrenceFilterError(ValueError):
    """Filters that cannot be understood: one message per query parameter."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{name}: {message}" for name, message in errors.items()))
        self.errors = errors


# The query parameters of an occurrence list's filters (the API refuses any other but its
# page cursor and size).
OCCURRENCE_FILTER_PARAMS: tuple[str, ...] = ("schedule", "state", "from", "to")


@dataclass(frozen=True)
class OccurrenceFilter:
    """What an occurrence list shows: query parameters `schedule`, `state`, `from`, `to`."""

    schedule_id: uuid.UUID | None = None
    state: Occurrence.State | None = None
    since: datetime | None = None  # scheduled_for >= since
    until: datetime | None = None  # scheduled_for < until

    def bounded(self, *, since: datetime, until: datetime) -> OccurrenceFilter:
        """This filter with a default for each open end of the time range."""
        return replace(self, since=self.since or since, until=self.until or until)

    def apply(self, queryset: QuerySet[Occurrence]) -> QuerySet[Occurrence]:
        if self.schedule_id is not None:
            queryset = queryset.filter(schedule_id=self.schedule_id)
        if self.state is not None:
            queryset = queryset.filter(state=self.state)
        if self.since is not None:
            queryset = queryset.filter(scheduled_for__gte=self.since)
        if self.until is not None:
            queryset = queryset.filter(scheduled_for__lt=self.until)
        return queryset


def parse_instant(text: str, *, naive_as_utc: bool) -> datetime:
    """ISO 8601 → an aware UTC datetime; ValueError with the message for people. The one
    parser of instants typed into a filter (API, web UI, admin): a malformed or impossible
    date is bad input, never a 500."""
    try:
        # parse_datetime raises for a well-formed impossible date (2026-02-30T00:00:00Z), and
        # the conversion to UTC for an instant at the edge of the calendar.
        value = parse_datetime(text)
        if value is not None and value.tzinfo is None and naive_as_utc:
            value = value.replace(tzinfo=UTC)
        if value is not None and value.tzinfo is not None:
            return value.astimezone(UTC)
    except (ValueError, OverflowError):
        pass
    example = "2026-03-08T09:30 (UTC)" if naive_as_utc else "2026-03-08T09:30:00Z"
    raise ValueError(f"Must be a date and time like {example}.")


def _state_named(text: str) -> Occurrence.State | None:
    """The state `text` names in any letter case ("succeeded", "SUCCEEDED"), or None."""
    folded = text.casefold()
    return next((state for state in Occurrence.State if state.value.casefold() == folded), None)


def parse_occurrence_filter(
    params: Mapping[str, str] | QueryDict, *, naive_as_utc: bool = False
) -> OccurrenceFilter:
    """The filters of an occurrence list from its query parameters (empty = not filtered).
    `state` is one of Occurrence.State in any letter case; `from`/`to` need an offset unless
    `naive_as_utc` (the web form's fields are UTC wall-clock time). Raises
    OccurrenceFilterError naming every bad parameter."""
    text = {name: (params.get(name) or "").strip() for name in OCCURRENCE_FILTER_PARAMS}
    errors: dict[str, str] = {}
    schedule_id: uuid.UUID | None = None
    if text["schedule"]:
        try:
            schedule_id = uuid.UUID(text["schedule"])
        except ValueError:
            errors["schedule"] = "Must be a schedule id (UUID)."
    state = _state_named(text["state"])
    if text["state"] and state is None:
        errors["state"] = f"Must be one of {', '.join(Occurrence.State.values)}."
    instants: dict[str, datetime] = {}
    for name in ("from", "to"):
        try:
            if text[name]:
                instants[name] = parse_instant(text[name], naive_as_utc=naive_as_utc)
        except ValueError as err:
            errors[name] = str(err)
    if errors:
        raise OccurrenceFilterError(errors)
    return OccurrenceFilter(
        schedule_id=schedule_id,
        state=state,
        since=instants.get("from"),
        until=instants.get("to"),
    )


def occurrences_filtered(
    *, tenant: Tenant, filters: OccurrenceFilter, only_state: Occurrence.State | None = None
) -> QuerySet[Occurrence]:
    """The tenant's occurrences matching `filters`. `only_state` narrows a list to one state
    whatever the filters say (the DLQ: DEAD; a `state` filter naming another then matches
    nothing)."""
    queryset = with_first_start(occurrences_for(tenant=tenant))
    if only_state is not None:
        queryset = queryset.filter(state=only_state)
    return filters.apply(queryset)


# Occurrences that have not run yet and still will: published or not, or waiting to retry.
PENDING_STATES: tuple[Occurrence.State, ...] = (
    Occurrence.State.SCHEDULED,
    Occurrence.State.ENQUEUED,
    Occurrence.State.RETRY_WAIT,
)


# How many instants `next_fires` lists (docs/api.md).
NEXT_FIRES = 5

# Pending occurrences whose instant has not fired yet. A RETRY_WAIT one has: its first attempt
# ran at its instant; what waits is a retry, which `next_run_at` shows, not a fire of the rule
# (docs/decisions.md "Next fires from the shown next run").
NOT_FIRED_STATES: tuple[Occurrence.State, ...] = (
    Occurrence.State.SCHEDULED,
    Occurrence.State.ENQUEUED,
)


@dataclass(frozen=True)
class UpcomingRuns:
    """What a schedule shows of its future (docs/api.md "The next run of a schedule")."""

    next_run_at: datetime | None
    fires: tuple[datetime, ...]


def _pending_instants(
    active: list[Schedule], *, now: datetime, fires: int
) -> dict[uuid.UUID, tuple[datetime | None, list[datetime]]]:
    """Per schedule: its earliest pending instant (any of PENDING_STATES) and its earliest
    `fires` instants not yet fired (NOT_FIRED_STATES), ascending. One query: a row number per
    schedule and kind (retry or not) keeps at most `fires` rows of each, however many
    instants a fast rule has written ahead."""
    since = now - timedelta(seconds=settings.TICK_RETRY_DEADLINE_S)
    retry = ExpressionWrapper(Q(state=Occurrence.State.RETRY_WAIT), output_field=BooleanField())
    rows = (
        Occurrence.objects.filter(
            tenant_id__in={s.tenant_id for s in active},
            schedule_id__in=[s.id for s in active],
            schedule_version=F("schedule__version"),
            state__in=PENDING_STATES,
            # A backfilled instant is past and a run now is extra: neither is the timetable's
            # next run.
            origin=Occurrence.Origin.SCHEDULED,
            scheduled_for__gte=since,
        )
        .annotate(
            rank=Window(
                RowNumber(),
                partition_by=[F("schedule_id"), retry],
                order_by=F("scheduled_for").asc(),
            )
        )
        .filter(rank__lte=max(fires, 1))
        .values_list("schedule_id", "scheduled_for", "state")
    )
    found: dict[uuid.UUID, tuple[datetime | None, list[datetime]]] = {}
    for schedule_id, scheduled_for, state in sorted(rows, key=lambda row: row[1]):
        earliest, not_fired = found.get(schedule_id, (None, []))
        if state in NOT_FIRED_STATES:
            not_fired.append(scheduled_for)
        found[schedule_id] = (earliest or scheduled_for, not_fired)
    return found


def upcoming_runs(
    schedules: Iterable[Schedule], *, now: datetime, fires: int = NEXT_FIRES
) -> dict[uuid.UUID, UpcomingRuns]:
    """The "next run" and the next `fires` instants the API and the pages show for each
    schedule (docs/api.md), nothing unless ACTIVE.

    - next run: the earliest instant not yet run — its earliest pending occurrence of the
      current version, or else its `next_run_at` (the materializer's cursor), whichever
      comes first;
    - fires: the instants not yet fired — its pending occurrences of the current version
      that have not started (SCHEDULED, ENQUEUED), then the rule's instants from the cursor
      on — the first `fires` of them before `end_at` (half-open).

    Scheduled occurrences only (a run now or a backfill is no fire of the rule). One query
    for all of them (a list page), bounded to the day partitions of the last
    TICK_RETRY_DEADLINE_S, the window in which an occurrence can still be in flight
    (docs/architecture.md, the backstop); the rule's instants are computed, not read."""
    shown: dict[uuid.UUID, UpcomingRuns] = {}
    active: list[Schedule] = []
    for schedule in schedules:
        if schedule.state == Schedule.State.ACTIVE:
            active.append(schedule)
        shown[schedule.id] = UpcomingRuns(None, ())
    if not active:
        return shown
    pending = _pending_instants(active, now=now, fires=fires)
    for schedule in active:
        earliest, not_fired = pending.get(schedule.id, (None, []))
        cursor = schedule.next_run_at
        candidates = [t for t in (earliest, cursor) if t is not None]
        ahead = set(not_fired)
        if cursor is not None:
            ahead.update(rule_times_from(schedule, cursor, fires - len(not_fired)))
        end_at = schedule.end_at
        listed = sorted(t for t in ahead if end_at is None or t < end_at)[:fires]
        shown[schedule.id] = UpcomingRuns(min(candidates, default=None), tuple(listed))
    return shown


def next_runs_shown(
    schedules: Iterable[Schedule], *, now: datetime | None = None
) -> dict[uuid.UUID, datetime | None]:
    """The "next run" of each schedule (`upcoming_runs`), in the same one query, without
    the instants of its next fires."""
    upcoming = upcoming_runs(schedules, now=now or timezone.now(), fires=0)
    return {schedule_id: runs.next_run_at for schedule_id, runs in upcoming.items()}
