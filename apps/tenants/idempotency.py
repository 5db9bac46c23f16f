"""The `Idempotency-Key` header of the API's creating POSTs (docs/api.md): one door for every
view that takes it, over `idempotency_lookup` / `idempotent_call` (services.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils import timezone
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.tenants.authentication import principal_of
from apps.tenants.services import (
    IdempotentResponse,
    idempotency_lookup,
    idempotency_request_hash,
    idempotent_call,
)

#: A view's work: validate, change, and answer (status, JSON body) to store for replays.
Call = Callable[[], tuple[int, Any]]


class IdempotentPost:
    """One POST and its key (checked here: 1 to 255 printable ASCII characters, else 400).
    `replay()` answers a stored response; `run(call)` runs the work once per key."""

    def __init__(self, request: Request) -> None:
        self.tenant = principal_of(request).tenant
        self.key = request.headers.get("Idempotency-Key")
        if self.key is not None and not (
            1 <= len(self.key) <= 255 and self.key.isascii() and self.key.isprintable()
        ):
            raise serializers.ValidationError(
                {"Idempotency-Key": ["Use 1 to 255 printable ASCII characters."]}
            )
        self.request_hash = idempotency_request_hash(
            method=request.method or "POST", path=request.path, data=request.data
        )

    def replay(self) -> Response | None:
        """The stored answer of an earlier POST with this key and body (409 for another
        body), or None: no key, or nothing stored yet."""
        if self.key is None:
            return None
        stored = idempotency_lookup(
            tenant=self.tenant, key=self.key, request_hash=self.request_hash, now=timezone.now()
        )
        return None if stored is None else _response(stored)

    def run(self, call: Call) -> Response:
        """`call`'s answer; with a key, run at most once and stored (a refusal is not)."""
        if self.key is None:
            code, body = call()
            return Response(body, status=code)
        return _response(
            idempotent_call(
                tenant=self.tenant, key=self.key, request_hash=self.request_hash, call=call
            )
        )


def idempotent_post(request: Request, call: Call) -> Response:
    """Run `call` once per Idempotency-Key (when given) and answer its response; a retry
    with the same key and body replays it (`Idempotent-Replayed: true`)."""
    post = IdempotentPost(request)
    replayed = post.replay()
    return replayed if replayed is not None else post.run(call)


def _response(result: IdempotentResponse) -> Response:
    headers = {"Idempotent-Replayed": "true"} if result.replayed else None
    return Response(result.body, status=result.status, headers=headers)
