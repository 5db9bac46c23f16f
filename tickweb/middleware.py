"""Request hygiene before any view runs (docs/decisions.md "No input yields a 5xx")."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

from tickweb.exceptions import error_body

NUL = "\x00"


class RejectNulMiddleware:
    """A NUL character in the path, in a query parameter or in a form field (name or value)
    is refused with 400 before it reaches a view: no field of Tick means anything with one,
    and PostgreSQL refuses it in every text value, so any filter, search, id lookup or save
    that passed it on would fail with a server error. The API answers in its error shape,
    naming each parameter; the web UI and the admin with a plain 400 page. (JSON bodies are
    refused field by field by the serializers.)"""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        bad = sorted(
            {
                name.replace(NUL, "\\0")
                for params in (request.GET, request.POST)
                for name, values in params.lists()
                if NUL in name or any(NUL in value for value in values)
            }
        )
        in_path = NUL in request.path
        if not bad and not in_path:
            return self.get_response(request)
        message = "NUL characters are not allowed in the request path, query or form."
        if request.path.startswith("/api/"):
            fields = {name: ["Must not contain NUL characters."] for name in bad}
            return JsonResponse(error_body("invalid", message, fields), status=400)
        named = f" (parameters: {', '.join(bad)})" if bad else ""
        return HttpResponseBadRequest(f"Bad request: {message}{named}", content_type="text/plain")
