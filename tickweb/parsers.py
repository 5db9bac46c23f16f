"""The API's only request parser: JSON with a size cap, a depth cap, and no 500s.

Stock `JSONParser` lets `RecursionError` from deeply nested input escape (a 500), and reads
bodies of any size. Here every bad body is a 4xx in the one error shape (tickweb.exceptions).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"
    default_detail = "The request body is too large."


def json_problem(value: Any, depth_limit: int) -> str | None:
    """Why a decoded JSON value cannot be stored, or None. Iterative (no recursion): nesting
    deeper than `depth_limit`; NUL characters and lone surrogates, which PostgreSQL text and
    jsonb refuse (they would otherwise surface as a 500 at INSERT time)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "Strings may not contain NUL (\\u0000) characters."
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "Strings may not contain unpaired surrogates (\\ud800-\\udfff)."
        elif isinstance(item, dict | list):
            if depth > depth_limit:
                return f"The JSON body nests deeper than {depth_limit} levels."
            if isinstance(item, dict):
                stack.extend((key, depth) for key in item)
                stack.extend((child, depth + 1) for child in item.values())
            else:
                stack.extend((child, depth + 1) for child in item)
    return None


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not valid JSON")


class TickJSONParser(JSONParser):
    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        cap = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        too_large = PayloadTooLarge(f"The request body is larger than {cap} bytes.")
        request = (parser_context or {}).get("request")
        meta = getattr(request, "META", {}) if request is not None else {}
        try:
            declared = int(meta.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > cap:
            raise too_large
        raw = stream.read(cap + 1)  # also bounds chunked bodies that declare no length
        if len(raw) > cap:
            raise too_large
        try:
            text = raw.decode("utf-8")
            # NaN/Infinity are not JSON and PostgreSQL's jsonb refuses them.
            data = json.loads(text, parse_constant=_reject_constant)
        except UnicodeDecodeError:
            raise ParseError("The request body is not UTF-8.") from None
        except RecursionError:
            raise ParseError("The JSON body is nested too deeply.") from None
        except ValueError as exc:
            raise ParseError(f"Malformed JSON: {exc}") from None
        problem = json_problem(data, settings.TICK_MAX_JSON_DEPTH)
        if problem is not None:
            raise ParseError(problem)
        return data
