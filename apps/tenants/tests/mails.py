"""Reading links out of mails in tests."""

from __future__ import annotations

import re


def link_in(body: object, pattern: str, group: int = 1) -> str:
    """The `group` of `pattern` in a mail body; fails the test when the mail has none."""
    match = re.search(pattern, str(body))
    assert match is not None, f"no {pattern!r} in {body!r}"
    return match.group(group)
