"""An independent, deliberately naive oracle for Tick's cron + DST contract.

Shares no code with ``apps.schedules.timerules`` and does not use croniter. It walks UTC
minutes one by one, converts each to the local wall clock with ``zoneinfo`` (zone files read
from the ``tzdata`` package, like production), and decides with the simplest possible rules:

* a UTC minute fires when its local wall time matches the cron fields and, with
  ``dst_fold="first"``, that wall time has not already been seen earlier in the walk (so a
  repeated local time fires only at its first instant);
* a jump of the wall clock by more than one minute between consecutive UTC minutes is a gap:
  with ``dst_gap="shift"``, if any skipped wall minute matches, the minute after the jump fires
  (once, even if it also matches by itself).

It is slow (one zone conversion per minute) and only meant for windows of a few days.
"""

from __future__ import annotations

import functools
import importlib.resources
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

_UTC = UTC
_MINUTE = timedelta(minutes=1)

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_NAMES = {
    3: "jan feb mar apr may jun jul aug sep oct nov dec".split(),
    4: "sun mon tue wed thu fri sat".split(),
}
_BOUNDS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]


@functools.cache
def zone(name: str) -> ZoneInfo:
    """The zone as shipped in the tzdata package (never the host's /usr/share/zoneinfo)."""
    path = importlib.resources.files("tzdata").joinpath("zoneinfo", *name.split("/"))
    with path.open("rb") as handle:
        return ZoneInfo.from_file(handle, key=name)


def _number(text: str, index: int) -> int:
    if index in _NAMES and text.lower() in _NAMES[index]:
        value = _NAMES[index].index(text.lower()) + (1 if index == 3 else 0)
    else:
        value = int(text)
    low, high = _BOUNDS[index]
    assert low <= value <= high, (text, index)
    return value


def _field(text: str, index: int) -> set[int]:
    low, high = _BOUNDS[index]
    out: set[int] = set()
    for part in text.split(","):
        step = 1
        stepped = "/" in part
        if stepped:
            part, step_text = part.split("/")
            step = int(step_text)
        if part == "*":
            first, last = low, high
        elif "-" in part:
            a, b = part.split("-")
            first, last = _number(a, index), _number(b, index)
        else:
            first = _number(part, index)
            last = high if stepped else first
        value = first
        while value <= last:
            out.add(value)
            value += step
    if index == 4 and 7 in out:
        out.discard(7)
        out.add(0)
    return out


class Cron:
    """A tiny five-field matcher for the subset the property tests generate."""

    def __init__(self, expression: str) -> None:
        text = _MACROS.get(expression.strip().lower(), expression.strip())
        fields = text.split()
        assert len(fields) == 5, expression
        self.minutes, self.hours, self.doms, self.months, self.dows = (
            _field(f, i) for i, f in enumerate(fields)
        )
        self.dom_any = fields[2] == "*"
        self.dow_any = fields[4] == "*"

    def matches(self, wall: datetime) -> bool:
        if wall.minute not in self.minutes or wall.hour not in self.hours:
            return False
        if wall.month not in self.months:
            return False
        dom_ok = wall.day in self.doms
        dow_ok = wall.isoweekday() % 7 in self.dows  # isoweekday: Monday 1 .. Sunday 7
        if self.dom_any or self.dow_any:
            return dom_ok and dow_ok
        return dom_ok or dow_ok


def _wall(instant: datetime, tz: ZoneInfo) -> datetime:
    return instant.astimezone(tz).replace(tzinfo=None)


def fire_times(
    expression: str,
    zone_name: str,
    after: datetime,
    until: datetime,
    dst_gap: str = "skip",
    dst_fold: str = "first",
) -> list[datetime]:
    """All fire instants in ``(after, until]`` (aware UTC), by walking UTC minutes."""
    cron = Cron(expression)
    tz = zone(zone_name)
    after = after.astimezone(_UTC)
    until = until.astimezone(_UTC)
    # Warm-up: walk from a day and a bit earlier so that every earlier occurrence of a repeated
    # local time within the walk is remembered in `seen`.
    u = after.replace(second=0, microsecond=0) - timedelta(hours=27)
    seen: set[datetime] = set()
    previous = _wall(u - _MINUTE, tz)
    out: list[datetime] = []
    while u <= until:
        wall = _wall(u, tz)
        repeated = wall in seen
        seen.add(wall)
        fire = cron.matches(wall) and (dst_fold == "both" or not repeated)
        if not fire and dst_gap == "shift" and wall - previous > _MINUTE:
            missing = previous + _MINUTE
            while missing < wall:
                if cron.matches(missing):
                    fire = True
                    break
                missing += _MINUTE
        if fire and u > after:
            out.append(u)
        previous = wall
        u += _MINUTE
    return out


@functools.cache
def transitions(zone_name: str, year: int) -> tuple[datetime, ...]:
    """UTC instants (to the minute) at which the zone's UTC offset changes during ``year``."""
    tz = zone(zone_name)
    u = datetime(year, 1, 1, tzinfo=_UTC)
    end = datetime(year + 1, 1, 1, tzinfo=_UTC)
    found: list[datetime] = []
    step = timedelta(hours=1)
    offset = u.astimezone(tz).utcoffset()
    while u < end:
        nxt = u + step
        nxt_offset = nxt.astimezone(tz).utcoffset()
        if nxt_offset != offset:
            probe = u
            while probe.astimezone(tz).utcoffset() == offset:
                probe += _MINUTE
            found.append(probe)
            offset = nxt_offset
        u = nxt
    return tuple(found)
