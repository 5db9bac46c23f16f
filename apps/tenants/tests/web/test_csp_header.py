"""The Content-Security-Policy header on pages and API answers, and templates that need no
inline code under it (docs/security.md "CSP and headers")."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from rest_framework.test import APIClient

POLICY = "Content-Security-Policy"


def _directives(header: str) -> dict[str, list[str]]:
    parts = (part.strip().split() for part in header.split(";") if part.strip())
    return {words[0]: words[1:] for words in parts}


def test_pages_and_api_answers_carry_the_strict_policy(client: Client, api_a: APIClient,
                                                       alice: Any) -> None:  # fmt: skip
    client.force_login(alice)
    for response in (
        Client().get("/login/"),
        client.get("/schedules/"),
        client.get("/admin/login/"),
        api_a.get("/api/v1/schedules"),
    ):
        directives = _directives(response[POLICY])
        assert directives["default-src"] == ["'self'"]
        assert directives["script-src"] == ["'self'"]
        assert directives["style-src"] == ["'self'"]
        assert directives["frame-ancestors"] == ["'none'"]
        assert directives["object-src"] == ["'none'"]
        assert "'unsafe-inline'" not in response[POLICY]
        assert "'unsafe-eval'" not in response[POLICY]


@pytest.mark.django_db  # every web request sets its row-level-security settings
def test_api_docs_allow_only_their_own_inline_style_by_hash(client: Client) -> None:
    page = client.get("/api/docs/")
    assert page.status_code == 200
    directives = _directives(page[POLICY])
    hashes = [s for s in directives["style-src"] if s.startswith("'sha256-")]
    assert directives["style-src"][0] == "'self'" and len(hashes) == 1
    assert "'unsafe-inline'" not in page[POLICY]
    # the init script is its own same-origin request, not inline
    assert re.search(r"<script>\s*\S", page.content.decode()) is None
    script = client.get("/api/docs/?script=")
    assert script.status_code == 200
    assert script["Content-Type"].startswith("application/javascript")


def test_templates_carry_no_inline_script_style_or_handler() -> None:
    inline = re.compile(
        r"<script(?![^>]*\b(src|type=\"application/json\")=?)[^>]*>|<style\b|\sstyle=|\son[a-z]+=",
        re.IGNORECASE,
    )
    found = []
    for path in sorted((settings.BASE_DIR / "templates").rglob("*.html")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if inline.search(line):
                found.append(f"{path.relative_to(settings.BASE_DIR)}:{number}: {line.strip()}")
    assert found == []
