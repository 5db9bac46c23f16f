"""Schedule labels: `key=value` pairs a tenant groups and finds its schedules by
(docs/api.md "Labels"). Stored as one jsonb object per schedule, found by `labels @> {…}`
through a GIN index (docs/decisions.md "Labels")."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

from apps.tenants.text import has_control_characters

# Lower-case letters, digits and `._/-`, starting with a letter or digit: the same key on
# every client, safe in a URL's query and a log line.
KEY_PATTERN: Final = re.compile(r"[a-z0-9][a-z0-9._/-]{0,62}")
KEY_MAX = 63
VALUE_MAX = 100
# `Tenant.max_labels_per_schedule` unless an operator changes it.
DEFAULT_LABEL_LIMIT = 10

KEY_RULE: Final = (
    "A label key is 1 to 63 characters: lower-case letters, digits and . _ / -, starting with "
    "a letter or digit."
)


class LabelError(ValueError):
    """A refused label, named by the field it belongs to (`labels` or `labels.<key>`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def key_error(key: Any) -> str | None:
    if not isinstance(key, str) or KEY_PATTERN.fullmatch(key) is None:
        return KEY_RULE
    return None


def value_error(value: Any) -> str | None:
    if not isinstance(value, str):
        return "A label value is a string."
    if not 1 <= len(value) <= VALUE_MAX:
        return f"A label value is 1 to {VALUE_MAX} characters."
    if has_control_characters(value) or value != value.strip():
        return "A label value has no control characters and no leading or trailing space."
    return None


def label_errors(labels: Any, *, limit: int) -> dict[str, list[str]]:
    """Every mistake in `labels`, by field: `labels` for the whole (not an object, over the
    tenant's `limit`), `labels.<key>` for one pair."""
    if not isinstance(labels, dict):
        return {"labels": ['Labels are a JSON object of strings, like {"customer": "42"}.']}
    errors: dict[str, list[str]] = {}
    if len(labels) > limit:
        errors["labels"] = [
            f"{len(labels)} labels; this tenant allows at most {limit} per schedule."
        ]
    for key, value in labels.items():
        problem = key_error(key) or value_error(value)
        if problem is not None:
            errors[f"labels.{key}"] = [problem]
    return errors


def parse_label_filter(text: str) -> tuple[str, str]:
    """`customer=42` as (key, value); the first `=` splits, so a value may hold one."""
    key, sep, value = text.partition("=")
    if not sep:
        raise LabelError("label", f"{text!r}: write a label filter as key=value.")
    problem = key_error(key) or value_error(value)
    if problem is not None:
        raise LabelError("label", f"{text!r}: {problem}")
    return key, value


def parse_label_lines(lines: Iterable[str]) -> dict[str, str]:
    """The web form's labels, one `key=value` per line (blank lines ignored); the values are
    judged afterwards with the API's rules (`label_errors`)."""
    labels: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        key, sep, value = text.partition("=")
        if not sep:
            raise LabelError("labels", f"Line {number}: write one label per line as key=value.")
        if key.strip() in labels:
            raise LabelError("labels", f"Line {number}: the key {key.strip()!r} is given twice.")
        labels[key.strip()] = value.strip()
    return labels


def labels_text(labels: dict[str, str]) -> str:
    """Labels as the web form shows them: one `key=value` per line, by key."""
    return "\n".join(f"{key}={labels[key]}" for key in sorted(labels))
