"""Names and labels people type (schedules, tenants, API keys, alert channels): one rule for
all of them. A control character in a name breaks the lines it is printed on (an alert's
subject, a log line, a terminal) or reorders what a reader sees (docs/security.md "Names and
labels")."""

from __future__ import annotations

import unicodedata
from typing import Final

from django.core.exceptions import ValidationError

# Bidirectional embeddings, overrides, isolates and marks: invisible, they make a name read
# differently from what it is ("Trojan source").
_BIDI_CONTROLS: Final = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
# C0 and C1 controls (tab, CR, LF, ESC, DEL, ...), line and paragraph separators.
_CONTROL_CATEGORIES: Final = frozenset({"Cc", "Zl", "Zp"})

CONTROL_CHARACTERS_MESSAGE: Final = (
    "Control characters (line breaks, tabs, escapes, bidirectional overrides) are not allowed."
)


def has_control_characters(value: str) -> bool:
    return any(
        char in _BIDI_CONTROLS or unicodedata.category(char) in _CONTROL_CATEGORIES
        for char in value
    )


def refuse_control_characters(value: str) -> None:
    """A validator for forms, serializers and model fields: `value` holds no control
    character."""
    if has_control_characters(value):
        raise ValidationError(CONTROL_CHARACTERS_MESSAGE, code="control_characters")
