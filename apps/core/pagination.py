"""Keyset pages for every tenant list, API and web: rows newest first on `(<instant>, id)`,
each page continuing strictly after the last row shown. Constant cost per page at any table
size and no COUNT, unlike OFFSET; on occurrences the instant is the partition key, so a page
also prunes partitions. A cursor is an opaque token; a forged, truncated or stale one is bad
input (`InvalidCursor`: 400 in the API, a message on the page), never a server error."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, Generic, TypeVar

from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils.dateparse import parse_datetime
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.utils.urls import replace_query_param

Row = TypeVar("Row", bound=Model)

FORWARD, BACKWARD = ">", "<"


class InvalidCursor(ValueError):
    def __init__(self) -> None:
        super().__init__("Invalid or expired page cursor; start again from the first page.")


@dataclass(frozen=True)
class Position:
    """A row's place in the list; `backward` cursors read the rows before it (API `previous`)."""

    at: datetime
    row_id: uuid.UUID
    backward: bool = False


def encode_cursor(position: Position) -> str:
    direction = BACKWARD if position.backward else FORWARD
    text = f"{direction}{position.at.isoformat()}|{position.row_id}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(token: str) -> Position:
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        at_text, _, id_text = text[1:].partition("|")
        # Normalised to UTC here, so an instant near the edge of the calendar fails now.
        at = parse_datetime(at_text)
        at = at.astimezone(UTC) if at is not None and at.tzinfo is not None else None
        row_id = uuid.UUID(id_text)
    except (ValueError, OverflowError):  # binascii.Error and UnicodeDecodeError included
        raise InvalidCursor from None
    if at is None or text[:1] not in (FORWARD, BACKWARD):
        raise InvalidCursor
    return Position(at=at, row_id=row_id, backward=text[:1] == BACKWARD)


@dataclass(frozen=True)
class KeysetPage(Generic[Row]):
    rows: list[Row]
    next_cursor: str | None
    previous_cursor: str | None


def _cursor_at(row: Model, field: str, *, backward: bool = False) -> str:
    at, row_id = attrgetter(field, "id")(row)
    return encode_cursor(Position(at, row_id, backward))


def keyset_page(
    queryset: QuerySet[Row], *, field: str, cursor: str | None, size: int
) -> KeysetPage[Row]:
    """One page of `queryset` ordered by `(-field, -id)`. Raises InvalidCursor."""
    position = decode_cursor(cursor) if cursor else None
    if position is not None and position.backward:
        return _page_before(queryset, field=field, position=position, size=size)
    ordered = queryset.order_by(f"-{field}", "-id")
    if position is not None:
        ordered = ordered.filter(**{f"{field}__lte": position.at}).exclude(
            **{field: position.at, "id__gte": position.row_id}
        )
    rows = list(ordered[: size + 1])
    more, rows = len(rows) > size, rows[:size]
    return KeysetPage(
        rows=rows,
        next_cursor=_cursor_at(rows[-1], field) if more else None,
        previous_cursor=_cursor_at(rows[0], field, backward=True) if position and rows else None,
    )


def _page_before(
    queryset: QuerySet[Row], *, field: str, position: Position, size: int
) -> KeysetPage[Row]:
    """The `size` rows just before `position` in list order (read ascending, then reversed)."""
    ordered = (
        queryset.order_by(field, "id")
        .filter(**{f"{field}__gte": position.at})
        .exclude(**{field: position.at, "id__lte": position.row_id})
    )
    rows = list(ordered[: size + 1])
    more, rows = len(rows) > size, rows[:size][::-1]
    return KeysetPage(
        rows=rows,
        next_cursor=_cursor_at(rows[-1], field) if rows else None,
        previous_cursor=_cursor_at(rows[0], field, backward=True) if more else None,
    )


class KeysetPagination(CursorPagination):
    """The API's list pages on `keyset_page`. Inherits from DRF's CursorPagination only its
    wire contract: the `cursor` and `page_size` parameters, the `{next, previous, results}`
    envelope and their OpenAPI description. Subclasses name the instant (`field`)."""

    field: str
    page_size: int = 50
    max_page_size = 200
    page_size_query_param = "page_size"

    def paginate_queryset(
        self, queryset: QuerySet[Any], request: Request, view: Any = None
    ) -> list[Any]:
        self.request = request
        self.list_url = request.build_absolute_uri()
        try:
            self.keyset = keyset_page(
                queryset,
                field=self.field,
                cursor=request.query_params.get(self.cursor_query_param) or None,
                size=self.get_page_size(request),
            )
        except InvalidCursor as err:
            raise ValidationError({self.cursor_query_param: [str(err)]}) from None
        return self.keyset.rows

    def get_page_size(self, request: Request) -> int:
        """`page_size` as given, 1..max_page_size; absent or empty = the default. Anything
        else is a 400 on `page_size` (DRF's own reading would fall back to the default for
        `page_size=null` and cut 5000 down silently: a client would not learn its mistake)."""
        text = request.query_params.get(self.page_size_query_param, "")
        if text == "":
            return self.page_size
        if not (text.isascii() and text.isdigit() and len(text) <= 6) or not (
            1 <= int(text) <= self.max_page_size
        ):
            raise ValidationError(
                {
                    self.page_size_query_param: [
                        f"Must be an integer from 1 to {self.max_page_size}."
                    ]
                }
            )
        return int(text)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {
                    "type": "integer", "minimum": 1, "maximum": self.max_page_size,
                    "default": self.page_size,
                }  # fmt: skip
                parameter["description"] = (
                    f"Rows per page, 1 to {self.max_page_size} (default {self.page_size})."
                )
        return parameters

    @classmethod
    def query_params(cls) -> tuple[str, ...]:
        """The query parameters a page reads: `cursor` and `page_size`."""
        return tuple(name for name in (cls.cursor_query_param, cls.page_size_query_param) if name)

    def get_next_link(self) -> str | None:
        return self._link(self.keyset.next_cursor)

    def get_previous_link(self) -> str | None:
        return self._link(self.keyset.previous_cursor)

    def _link(self, cursor: str | None) -> str | None:
        if cursor is None:
            return None
        return str(replace_query_param(self.list_url, self.cursor_query_param, cursor))


def unknown_query_params(request: Request, known: Iterable[str]) -> dict[str, list[str]]:
    """An error for each query parameter the endpoint does not read, in the shape of a
    ValidationError's detail: a misspelt filter (`schedule_id` for `schedule`) must not answer
    an unfiltered list (docs/api.md)."""
    allowed = sorted(set(known))
    message = f"Unknown query parameter; this endpoint reads {', '.join(allowed)}."
    return {name: [message] for name in request.query_params if name not in allowed}


WEB_CURSOR = "after"


@dataclass(frozen=True)
class WebPage(Generic[Row]):
    """A web list page: its rows, the pager's template values, and why it is empty if the
    `after` link was bad."""

    rows: list[Row]
    next_cursor: str | None
    paged: bool
    filters: str  # the query string without the cursor: "first page" and "next" links
    error: str | None = None

    def pager(self) -> dict[str, Any]:
        return {"next_cursor": self.next_cursor, "paged": self.paged, "filters": self.filters}


def web_page(
    request: HttpRequest, queryset: QuerySet[Row], *, field: str, size: int
) -> WebPage[Row]:
    cursor = request.GET.get(WEB_CURSOR) or None
    query = request.GET.copy()
    query.pop(WEB_CURSOR, None)
    try:
        page = keyset_page(queryset, field=field, cursor=cursor, size=size)
    except InvalidCursor as err:
        return WebPage([], None, paged=True, filters=query.urlencode(), error=str(err))
    return WebPage(page.rows, page.next_cursor, paged=cursor is not None, filters=query.urlencode())
