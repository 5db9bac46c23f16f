"""The date-and-time strings of an API answer, for tests of the one timestamp format
(docs/api.md)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

INSTANT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}")


def instants(body: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every (JSON path, string) in `body` that is a date and time."""
    if isinstance(body, dict):
        for key, value in body.items():
            yield from instants(value, f"{path}.{key}")
    elif isinstance(body, list):
        for index, value in enumerate(body):
            yield from instants(value, f"{path}[{index}]")
    elif isinstance(body, str) and INSTANT.match(body):
        yield path, body


def not_in_z(body: Any) -> list[tuple[str, str]]:
    """The instants of `body` not written in UTC with `Z`."""
    return [(path, text) for path, text in instants(body) if not text.endswith("Z")]
