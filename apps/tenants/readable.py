"""Instants and event details as people read them, on the tenant pages and in the admin
(docs/ui.md "Timestamps"): one format, `2026-12-03 23:45:00 UTC`."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any


def instant_text(value: datetime | None, *, ms: bool = False) -> str:
    """`2026-12-03 09:00:00 UTC`: the API's RFC 3339 instant with a space for "T" and " UTC"
    for "Z"; `ms` adds milliseconds. Empty for None."""
    if not isinstance(value, datetime):
        return ""
    at = value.astimezone(UTC)
    text = at.strftime("%Y-%m-%d %H:%M:%S")
    if ms:
        text += f".{at.microsecond // 1000:03d}"
    return f"{text} UTC"


# An instant as the services write it into an event's detail (`isoformat()`, or the API's `Z`).
_ISO_INSTANT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:\d{2})")


def _readable(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return instant_text(value)
    if isinstance(value, str):
        if _ISO_INSTANT.fullmatch(value):
            try:
                return instant_text(datetime.fromisoformat(value.replace("Z", "+00:00")))
            except ValueError:
                return value
        return value
    if isinstance(value, dict):
        if not value:
            return "none"
        return ", ".join(f"{str(k).replace('_', ' ')} {_readable(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_readable(v) for v in value) if value else "none"
    return str(value)


def detail_pairs(detail: Any) -> list[tuple[str, str]]:
    """An event's `detail` JSON as (label, text) pairs for people: instants in the one format,
    yes/no for booleans, `none` for an empty map or list, nested maps flattened to words —
    not the Python repr of the JSON (`next_run_at=…+00:00, skipped={}`)."""
    if not isinstance(detail, dict):
        return [] if detail in (None, "", {}) else [("detail", _readable(detail))]
    return [(str(key).replace("_", " "), _readable(value)) for key, value in detail.items()]


def detail_text(detail: Any) -> str:
    """`detail_pairs` on one line: "next run at: 2026-12-03 09:00:00 UTC · skipped: none"."""
    return " · ".join(f"{label}: {text}" for label, text in detail_pairs(detail)) or "—"
