"""System checks of tickweb/checks.py: the defaults pass, each broken invariant is reported
under its id. (Kept here because pytest collects tests under apps/ only.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core import checks
from django.test import override_settings

from tickweb.checks import (
    check_admin_two_factor,
    check_audit_bounds,
    check_lease_ttl,
    check_pipeline_windows,
    check_utc,
    check_value_ranges,
    check_web_role,
)


def _ids(messages: list[checks.CheckMessage]) -> list[str | None]:
    return [message.id for message in messages]


def test_defaults_raise_no_tick_message():
    messages = checks.run_checks()

    assert [m for m in messages if (m.id or "").startswith("tick.")] == []


def test_the_checks_are_registered():
    registered = checks.registry.registry.get_checks()

    for check in (
        check_utc,
        check_value_ranges,
        check_pipeline_windows,
        check_lease_ttl,
        check_audit_bounds,
    ):
        assert check in registered


@override_settings(TIME_ZONE="Europe/Paris")
def test_a_time_zone_other_than_utc_is_e001():
    assert _ids(check_utc()) == ["tick.E001"]


@override_settings(USE_TZ=False)
def test_naive_datetimes_are_e002():
    assert _ids(check_utc()) == ["tick.E002"]


@pytest.mark.parametrize(
    ("name", "value", "error_id"),
    [
        ("TICK_SHARDS", 0, "tick.E003"),
        ("TICK_TENANT_PARTITIONS", 0, "tick.E003"),
        ("TICK_MATERIALIZE_BATCH", 0, "tick.E003"),
        ("TICK_MAX_FIRES_PER_PASS", 0, "tick.E003"),
        ("TICK_RELAY_BATCH", 0, "tick.E003"),
        ("TICK_RELAY_ENVELOPE_MAX", 0, "tick.E003"),
        ("TICK_MAX_ATTEMPTS", 0, "tick.E003"),
        ("TICK_REDELIVER_AFTER_S", 0, "tick.E004"),
        ("TICK_ATTEMPT_LEASE_S", 0, "tick.E004"),
        ("TICK_LEASE_TTL_S", 0, "tick.E004"),
        ("TICK_RETRY_DEADLINE_S", 0, "tick.E004"),
        ("TICK_OVERLAP_RECHECK_S", 0, "tick.E004"),
        ("TICK_WEBHOOK_READ_TIMEOUT_S", 0.0, "tick.E004"),
        ("TICK_RELAY_LOOKAHEAD_MS", -1, "tick.E005"),
        ("TICK_MISSED_RECORD_LIMIT", -1, "tick.E005"),
        ("TICK_LOGIN_FAILURE_LIMIT", 0, "tick.E003"),
        ("TICK_LOGIN_COOLOFF_S", 0, "tick.E004"),
        ("TICK_ALERT_MAX_ATTEMPTS", 0, "tick.E003"),
        ("TICK_ALERT_DIGEST_LIST_MAX", 0, "tick.E003"),
        ("TICK_ALERT_LAG_EVERY_S", 0, "tick.E004"),
        ("EMAIL_TIMEOUT", 0, "tick.E004"),
        ("TICK_ALERT_COALESCE_S", -1, "tick.E005"),
        ("TICK_ALERT_CHANNEL_INTERVAL_S", -1, "tick.E005"),
    ],
)
def test_a_value_out_of_range_is_reported_under_its_id(name, value, error_id):
    with override_settings(**{name: value}):
        messages = check_value_ranges()

    assert _ids(messages) == [error_id]
    assert name in messages[0].msg


@pytest.mark.parametrize(
    "name",
    [
        "TICK_RELAY_LOOKAHEAD_MS",
        "TICK_MISSED_RECORD_LIMIT",
        "TICK_ALERT_COALESCE_S",
        "TICK_ALERT_CHANNEL_INTERVAL_S",
    ],
)
def test_zero_is_allowed_where_only_negatives_are_refused(name):
    with override_settings(**{name: 0}):
        assert check_value_ranges() == []


# Each cross-setting invariant at its edge: with `fixed` in place, `name` = `refused` is
# reported under its id and level; one step to the safe side, `allowed`, passes.
@pytest.mark.parametrize(
    ("check", "fixed", "name", "refused", "allowed", "error_id", "level"),
    [
        pytest.param(
            check_pipeline_windows, {"TICK_PLANNING_WINDOW_S": 20, "TICK_LEASE_TTL_S": 15},
            "TICK_RELAY_LOOKAHEAD_MS", 20_000, 19_999, "tick.E006", checks.ERROR,
            id="planning-window-not-beyond-relay-look-ahead",
        ),
        pytest.param(
            check_pipeline_windows, {"TICK_RELAY_LOOKAHEAD_MS": 5000, "TICK_LEASE_TTL_S": 15},
            "TICK_PLANNING_WINDOW_S", 15, 16, "tick.E007", checks.ERROR,
            id="planning-window-not-beyond-lease-ttl",
        ),
        pytest.param(
            check_pipeline_windows, {"TICK_RETENTION_DAYS": 1},
            "TICK_RETRY_DEADLINE_S", 86_401, 86_400, "tick.E008", checks.ERROR,
            id="retention-shorter-than-retry-deadline",
        ),
        pytest.param(
            check_lease_ttl, {"TICK_RELAY_LOOKAHEAD_MS": 5000},
            "TICK_LEASE_TTL_S", 6, 7, "tick.W003", checks.WARNING,
            id="lease-ttl-not-beyond-relay-look-ahead",
        ),
        pytest.param(
            check_audit_bounds, {"TICK_RETRY_CAP_S": 600},
            "TICK_AUDIT_ENQUEUED_BOUND_S", 600, 601, "tick.W001", checks.WARNING,
            id="audit-enqueued-bound-within-retry-cap",
        ),
    ],
)  # fmt: skip
def test_a_broken_invariant_between_settings_is_reported_at_its_edge(
    check, fixed, name, refused, allowed, error_id, level
):
    with override_settings(**fixed, **{name: refused}):
        messages = check()
    with override_settings(**fixed, **{name: allowed}):
        assert check() == []

    assert _ids(messages) == [error_id]
    assert messages[0].level == level


def test_manage_py_check_refuses_a_bad_environment():
    env = {**os.environ, "DJANGO_DEBUG": "1", "TICK_RELAY_ENVELOPE_MAX": "0"}

    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--fail-level", "WARNING"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip

    assert result.returncode != 0
    assert "tick.E003" in result.stderr and "TICK_RELAY_ENVELOPE_MAX" in result.stderr


def test_an_admin_without_two_factor_is_w004_under_deploy_checks():
    with override_settings(TICK_ADMIN_OTP_REQUIRED=False):
        messages = check_admin_two_factor()
    with override_settings(TICK_ADMIN_OTP_REQUIRED=True):
        assert check_admin_two_factor() == []

    assert _ids(messages) == ["tick.W004"]
    assert messages[0].level == checks.WARNING
    registered = checks.registry.registry.get_checks(include_deployment_checks=True)
    assert check_admin_two_factor in registered
    assert check_admin_two_factor not in checks.registry.registry.get_checks()


def test_a_malformed_signing_key_is_e060_and_a_real_one_passes():
    from cryptography.fernet import Fernet

    from tickweb.checks import check_signing_keys

    good = Fernet.generate_key().decode()
    with override_settings(TICK_SIGNING_KEYS=[good, "not-a-fernet-key"]):
        assert _ids(check_signing_keys()) == ["tick.E060"]
        assert "entry 2" in check_signing_keys()[0].msg
    with override_settings(TICK_SIGNING_KEYS=[good]):
        assert check_signing_keys() == []


@pytest.mark.parametrize("role", ["Tick-Web", "1web", "pg_web", "web; DROP TABLE x", ""])
def test_a_web_role_that_is_no_plain_role_name_is_e020(role):
    with override_settings(TICK_DB_WEB_ROLE=role):
        assert _ids(check_web_role()) == ["tick.E021"]


def test_the_default_web_role_passes():
    assert check_web_role() == []
