"""Template filters of the web UI: one timestamp format everywhere, JSON shown as JSON, and
durations in words (docs/ui.md "Timestamps")."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django import template

from apps.tenants.devices import device_label
from apps.tenants.readable import detail_pairs, instant_text

register = template.Library()


@register.filter
def ts(value: datetime | None, precision: str = "") -> str:
    """`2026-12-03 09:00:00 UTC` (`readable.instant_text`); `ts:"ms"` adds milliseconds.
    Empty for None, so `|default:"—"` applies."""
    return instant_text(value, ms=precision == "ms")


@register.filter
def event_detail(detail: Any) -> list[tuple[str, str]]:
    """An event's `detail` JSON as (label, text) pairs for people (`readable.detail_pairs`)."""
    return detail_pairs(detail)


@register.filter
def device(user_agent: str | None) -> str:
    """A User-Agent header as "Chrome on Linux" (`devices.device_label`)."""
    return device_label(user_agent or "")


@register.filter
def pretty_json(value: Any) -> str:
    """A JSON value as indented JSON (not a Python repr: `true`, `null`, double quotes)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


@register.filter
def ago(value: datetime | None, now: datetime) -> str:
    """`value` relative to `now` in one unit: "just now", "4 min ago", "3 h ago", "2 d ago"
    (or "in 5 min" ahead)."""
    if not isinstance(value, datetime):
        return ""
    seconds = int((now - value).total_seconds())
    ahead, seconds = seconds < 0, abs(seconds)
    if seconds < 60:
        return "just now" if not ahead else "in under a minute"
    for size, unit in ((86_400, "d"), (3_600, "h"), (60, "min")):
        if seconds >= size:
            amount = f"{seconds // size} {unit}"
            return f"in {amount}" if ahead else f"{amount} ago"
    return ""  # unreachable: seconds >= 60 matched "min"


@register.filter
def percent(value: float | None) -> str:
    return "" if value is None else f"{round(value * 100)}%"
