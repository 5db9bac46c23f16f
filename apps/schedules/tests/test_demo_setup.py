"""`manage.py demo_setup` (docs/security.md "Demo login"): the known demo password only with
DJANGO_DEBUG on; otherwise a random one printed once, and a rerun never resets a password."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import override_settings

from apps.tenants.services import DEMO_PASSWORD

pytestmark = pytest.mark.django_db


def _run(**options: Any) -> str:
    out = io.StringIO()
    call_command("demo_setup", stdout=out, **options)
    return out.getvalue()


def _demo() -> Any:
    return get_user_model().objects.get(username="demo")


@override_settings(DEBUG=True)
def test_debug_run_creates_the_documented_demo_login() -> None:
    out = _run()

    assert f"user demo / {DEMO_PASSWORD}" in out
    assert _demo().check_password(DEMO_PASSWORD)
    assert _demo().is_superuser


@override_settings(DEBUG=False)
def test_without_debug_the_login_gets_a_random_password_printed_once() -> None:
    # given a first run without DEBUG
    first = _run()
    printed = re.search(r"user demo / (\S+)", first)

    # then the known password is not the demo's, the printed one is
    assert printed is not None
    assert printed.group(1) != DEMO_PASSWORD and len(printed.group(1)) >= 20
    assert not _demo().check_password(DEMO_PASSWORD)
    assert _demo().check_password(printed.group(1))

    # when it runs again, the password is kept and not printed
    second = _run()
    assert printed.group(1) not in second
    assert "password unchanged" in second
    assert _demo().check_password(printed.group(1))


@override_settings(DEBUG=False)
def test_without_debug_the_known_password_is_refused_and_replaced() -> None:
    with pytest.raises(CommandError, match="known demo password"):
        _run(password=DEMO_PASSWORD)
    assert not get_user_model().objects.filter(username="demo").exists()

    # a login left on the known password by an earlier debug run gets a random one
    with override_settings(DEBUG=True):
        _run()
    out = _run()
    printed = re.search(r"user demo / (\S+)", out)
    assert printed is not None and printed.group(1) != DEMO_PASSWORD
    assert not _demo().check_password(DEMO_PASSWORD)


@override_settings(DEBUG=True)
def test_a_rerun_does_not_reset_a_changed_password() -> None:
    _run()
    user = _demo()
    user.set_password("changed-by-the-owner-1")
    user.save()

    out = _run()

    assert _demo().check_password("changed-by-the-owner-1")
    assert "password unchanged" in out


@override_settings(DEBUG=True)
def test_the_printed_curl_carries_the_printed_key_and_asks_for_finished_runs(client) -> None:
    out = _run()
    key = re.search(r"^api key: (\S+)$", out, re.MULTILINE)
    curl = re.search(r"curl -H 'Authorization: Bearer (\S+)' '(\S+)'", out)

    assert key is not None and curl is not None
    assert curl.group(1) == key.group(1)
    assert "state=succeeded" in curl.group(2)
    path = curl.group(2).split("127.0.0.1:8000", 1)[1]
    answer = client.get(path, HTTP_AUTHORIZATION=f"Bearer {key.group(1)}")
    assert answer.status_code == 200
    assert all(row["state"] == "SUCCEEDED" for row in answer.json()["results"])
