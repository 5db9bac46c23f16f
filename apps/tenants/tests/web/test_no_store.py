"""Responses that show a secret are never cached (docs/security.md "Secrets in responses")."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from apps.core.no_store import ShowsSecretMixin

pytestmark = pytest.mark.django_db


def _uncacheable(response: Any) -> bool:
    directives = {d.strip() for d in response.get("Cache-Control", "").split(",")}
    return {"no-store", "private"} <= directives and response.get("Pragma") == "no-cache"


def test_the_page_showing_a_new_api_key_is_not_stored(client: Client, alice: Any) -> None:
    client.force_login(alice)

    created = client.post("/keys/", {"name": "ci-deploy"})

    assert created.status_code == 200
    assert "Your new key (shown once)" in created.content.decode()
    assert _uncacheable(created)
    assert _uncacheable(client.get("/keys/"))
    # pages without a secret stay as they were
    assert "no-store" not in client.get("/schedules/").get("Cache-Control", "")


class _SecretView(ShowsSecretMixin, APIView):
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    def post(self, request: Any) -> Response:
        return Response({"secret": "s3cr3t"}, status=201)


def test_api_views_with_the_mixin_answer_no_store() -> None:
    request = APIRequestFactory().post("/x", {}, format="json")

    response = _SecretView.as_view()(request)

    assert response.status_code == 201
    assert _uncacheable(response)
