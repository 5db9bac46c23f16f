"""Structured logging (docs/operations.md "Structured logs"): every record carries
`tenant_id`, `schedule_id` and `occurrence_id`, from `extra=` or as "-" (lines about a whole
batch carry counts instead).

Hot paths log per batch or per occurrence-run, never per row inside a batch, so the cost is
one dict lookup per line.
"""

from __future__ import annotations

import json
import logging
from typing import Any

IDS = ("tenant_id", "schedule_id", "occurrence_id")


class IdsFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for name in IDS:
            if not hasattr(record, name):
                setattr(record, name, "-")
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "at": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in IDS:
            data[name] = str(getattr(record, name, "-"))
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data)


def ids(
    *, tenant_id: object = "-", schedule_id: object = "-", occurrence_id: object = "-"
) -> dict[str, str]:
    """`extra=` for a log line about one occurrence."""
    return {
        "tenant_id": str(tenant_id),
        "schedule_id": str(schedule_id),
        "occurrence_id": str(occurrence_id),
    }
