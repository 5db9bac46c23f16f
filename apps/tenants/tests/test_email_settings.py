"""E-mail settings: one EMAIL_URL read by tickweb/settings.py, the console backend when it
is unset, and tick.W021 under `check --deploy` for a deployment that would lose its mail."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from django.test import override_settings

from tickweb.checks import check_email_configured

READ = (
    "import json, django; from django.conf import settings; django.setup(); print(json.dumps("
    "[settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_HOST_USER,"
    " settings.EMAIL_HOST_PASSWORD, settings.EMAIL_USE_TLS, settings.EMAIL_USE_SSL,"
    " settings.DEFAULT_FROM_EMAIL]))"
)


def _settings_with(**env: str) -> list[object]:
    environ = {k: v for k, v in os.environ.items() if k not in {"EMAIL_URL", "DEFAULT_FROM_EMAIL"}}
    environ.update({"DJANGO_DEBUG": "1", "DJANGO_SETTINGS_MODULE": "tickweb.settings", **env})
    result = subprocess.run(
        [sys.executable, "-c", READ], env=environ, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    return list(json.loads(result.stdout.strip().splitlines()[-1]))


def test_one_url_sets_host_port_credentials_and_starttls():
    values = _settings_with(
        EMAIL_URL="smtp://mailer:s%40cret@smtp.example.com:587/?tls=1",
        DEFAULT_FROM_EMAIL="Tick <noreply@example.com>",
    )

    assert values == [
        "django.core.mail.backends.smtp.EmailBackend", "smtp.example.com", 587, "mailer",
        "s@cret", True, False, "Tick <noreply@example.com>",
    ]  # fmt: skip


def test_implicit_tls_is_the_ssl_flag():
    values = _settings_with(EMAIL_URL="smtp://smtp.example.com:465/?ssl=1")

    assert values[0:3] == ["django.core.mail.backends.smtp.EmailBackend", "smtp.example.com", 465]
    assert values[5:7] == [False, True]


def test_unset_prints_mail_to_the_console():
    values = _settings_with()

    assert values[0] == "django.core.mail.backends.console.EmailBackend"
    assert values[7] == "Tick <tick@localhost>"


@override_settings(EMAIL_URL="")
def test_no_email_url_is_a_deploy_warning():
    assert [m.id for m in check_email_configured()] == ["tick.W021"]


@override_settings(EMAIL_URL="smtp://smtp.example.com:587/?tls=1")
def test_a_configured_email_url_passes_the_deploy_check():
    assert check_email_configured() == []
