"""The API's documented errors, written once: every 4xx answers in one shape
(tickweb/exceptions.py), and each operation lists the codes it may answer.

An API module builds its table once, naming only what its resources add:

    _errors = error_table({404: "No such schedule in this tenant.", 409: "…"})
    @extend_schema(responses={200: ScheduleSerializer, **_errors(404, *COMMON)})

A key `"<code>-<variant>"` (e.g. `"409-confirm"`) documents a narrower meaning of a code for
the operations that answer it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema_field
from rest_framework import serializers

# Every authenticated operation may answer these; every operation with a body these.
COMMON = (401, 429)
BODY = (400, 413, 415)


def done_or_accepted(done: Any, accepted: Any) -> dict[int, Any]:
    """The success answers of a POST that is either finished at once (200: e.g. a dry run,
    a cancel of a queued run) or accepted to run after the answer (202)."""
    return {200: done, 202: accepted}


# The meanings shared by every API; a table may override any of them.
GENERIC: Mapping[int | str, str] = {
    400: "Invalid input (field errors in `error.fields`).",
    401: "Missing, unknown, revoked or expired API key.",
    413: "Request body over the size cap.",
    415: "Only application/json bodies are accepted.",
    429: "Per-key rate limit; retry after `Retry-After` seconds.",
}


@extend_schema_field(
    {
        "type": "object",
        "required": ["code", "message", "fields"],
        "properties": {
            "code": {"type": "string", "description": "Stable, machine-readable."},
            "message": {"type": "string", "description": "For people."},
            "fields": {
                "type": "object",
                "description": "Request field (or non_field_errors) -> messages.",
                "additionalProperties": {"type": "array", "items": {"type": "string"}},
            },
        },
    }
)
class _ErrorObjectField(serializers.JSONField):
    pass


class ErrorSerializer(serializers.Serializer[Any]):
    """The one error shape of every 4xx (tickweb/exceptions.py)."""

    error = _ErrorObjectField()


ErrorTable = Callable[..., dict[int, OpenApiResponse]]


def error_table(specific: Mapping[int | str, str]) -> ErrorTable:
    """A function answering the documented responses for the codes (or variants) it is given,
    with `specific`'s meanings over the generic ones."""
    described = {**GENERIC, **specific}

    def errors(*codes: int | str) -> dict[int, OpenApiResponse]:
        return {
            int(str(c).split("-")[0]): OpenApiResponse(ErrorSerializer, description=described[c])
            for c in codes
        }

    return errors


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=False,
    description=(
        "Up to 255 printable ASCII characters, kept per tenant for at least 24 h. A retry "
        "with the same key and body returns the first response (status and body, header "
        "`Idempotent-Replayed: true`), also while the first is still running; the same key "
        "with another body answers 409."
    ),
)
