"""`Cache-Control: no-store` for every response that shows a secret: a raw API key right
after it is created, and anything like it (docs/security.md "Secrets in responses"). Neither
the browser's cache and history nor a proxy may keep a copy. Web views take the decorator,
DRF views the mixin."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from django.http import HttpRequest, HttpResponseBase
from django.utils.cache import add_never_cache_headers, patch_cache_control
from rest_framework.request import Request
from rest_framework.response import Response

View = TypeVar("View", bound=Callable[..., HttpResponseBase])


def no_store(response: HttpResponseBase) -> HttpResponseBase:
    """Mark `response` uncacheable anywhere (and, for HTTP/1.0 caches, `Pragma: no-cache`)."""
    add_never_cache_headers(response)  # no-cache, no-store, must-revalidate, private, max-age=0
    patch_cache_control(response, no_store=True, private=True)
    response["Pragma"] = "no-cache"
    return response


def shows_secret(view: View) -> View:
    """Decorator for a web view whose response may show a secret."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        return no_store(view(request, *args, **kwargs))

    return wrapped  # type: ignore[return-value]


class ShowsSecretMixin:
    """For a DRF view whose responses may show a secret (errors included)."""

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        finalized: Response = super().finalize_response(  # type: ignore[misc]
            request, response, *args, **kwargs
        )
        no_store(finalized)
        return finalized
