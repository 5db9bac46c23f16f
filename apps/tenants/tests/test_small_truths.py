"""Small things a newcomer meets in the first hour (docs/ui.md): the new-schedule form
preselects no handler, /favicon.ico is served, an unknown API path answers the JSON error
shape even with DJANGO_DEBUG=1, and the webhook receiver's guide is a page tenants can
open from the signing page."""

from __future__ import annotations

import re

import pytest
from django.test import override_settings

pytestmark = pytest.mark.django_db


def test_the_new_schedule_form_preselects_no_handler(client, alice):
    client.force_login(alice)

    page = client.get("/schedules/new/").content.decode()

    select = re.search(r'<select name="handler".*?</select>', page, re.S)
    assert select is not None
    assert re.findall(r"<option[^>]*selected[^>]*>([^<]*)", select.group(0)) == [
        "— choose a handler —"
    ]


def test_favicon_is_served(client):
    response = client.get("/favicon.ico")

    assert response.status_code == 200 and response["Content-Type"] == "image/x-icon"
    assert response.content[:4] == b"\x00\x00\x01\x00"  # an ICO header


@override_settings(DEBUG=True)
def test_an_unknown_api_path_answers_json_with_debug_on(client):
    response = client.get("/api/v1/no-such-thing")

    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "not_found"


def test_the_signing_page_links_the_webhook_guide_rendered(client, alice):
    client.force_login(alice)

    signing = client.get("/signing/").content.decode()
    guide = client.get("/docs/webhooks/")

    assert 'href="/docs/webhooks/"' in signing and "docs/webhooks.md" not in signing
    body = guide.content.decode()
    assert guide.status_code == 200 and '<nav class="nav">' in body
    assert re.search(r"<h1>[^<]+</h1>", body) and "<code>webhook-signature</code>" in body
    assert "<script>" not in body.split('id="doc"', 1)[1]
