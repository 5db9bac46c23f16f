"""Lists inside a page stay short (docs/ui.md "Pages stay short"): each shows its first
`cap` rows and a "Show more" link (`?show=<name>#more-<name>`) that shows up to `expanded_cap`;
past that the page points to the list's own page, where there is one."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest

LIST_CAP = 10
EXPANDED_CAP = 200


@dataclass(frozen=True)
class PageList:
    name: str  # the anchor and the `show` value of its link
    rows: list[Any]
    more: bool  # rows beyond those shown
    expanded: bool  # "Show more" was followed

    def __iter__(self) -> Any:
        return iter(self.rows)

    def __getitem__(self, index: int) -> Any:
        return self.rows[index]

    def __len__(self) -> int:
        return len(self.rows)

    def __bool__(self) -> bool:
        return bool(self.rows)


def page_list(
    request: HttpRequest,
    name: str,
    rows: QuerySet[Any] | Sequence[Any] | Iterable[Any],
    *,
    cap: int = LIST_CAP,
    expanded_cap: int = EXPANDED_CAP,
) -> PageList:
    """The first `cap` of `rows` (or `expanded_cap` when the request asks to show `name`),
    reading one row more to know whether others follow."""
    expanded = request.GET.get("show") == name
    limit = expanded_cap if expanded else cap
    if isinstance(rows, QuerySet):
        found = list(rows[: limit + 1])
    else:
        found = list(islice(iter(rows), limit + 1))
    return PageList(name, found[:limit], len(found) > limit, expanded)
