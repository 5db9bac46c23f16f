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
    check_audit_bounds,
    check_pipeline_windows,
    check_utc,
    check_value_ranges,
)


def _ids(messages: list[checks.CheckMessage]) -> list[str | None]:
    return [message.id for message in messages]


def test_defaults_raise_no_tick_message():
    messages = checks.run_checks()

    assert [m for m in messages if (m.id or "").startswith("tick.")] == []


def test_the_checks_are_registered():
    registered = checks.registry.registry.get_checks()

    for check in (check_utc, check_value_ranges, check_pipeline_windows, check_audit_bounds):
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
    ],
)
def test_a_value_out_of_range_is_reported_under_its_id(name, value, error_id):
    with override_settings(**{name: value}):
        messages = check_value_ranges()

    assert _ids(messages) == [error_id]
    assert name in messages[0].msg


@pytest.mark.parametrize("name", ["TICK_RELAY_LOOKAHEAD_MS", "TICK_MISSED_RECORD_LIMIT"])
def test_zero_is_allowed_where_only_negatives_are_refused(name):
    with override_settings(**{name: 0}):
        assert check_value_ranges() == []


@override_settings(TICK_PLANNING_WINDOW_S=20, TICK_LEASE_TTL_S=15)
def test_a_planning_window_not_beyond_the_relay_look_ahead_is_e006():
    with override_settings(TICK_RELAY_LOOKAHEAD_MS=20_000):
        assert _ids(check_pipeline_windows()) == ["tick.E006"]
    with override_settings(TICK_RELAY_LOOKAHEAD_MS=19_999):
        assert check_pipeline_windows() == []


@override_settings(TICK_RELAY_LOOKAHEAD_MS=5000, TICK_LEASE_TTL_S=15)
def test_a_planning_window_not_beyond_the_lease_ttl_is_e007():
    with override_settings(TICK_PLANNING_WINDOW_S=15):
        assert _ids(check_pipeline_windows()) == ["tick.E007"]
    with override_settings(TICK_PLANNING_WINDOW_S=16):
        assert check_pipeline_windows() == []


@override_settings(TICK_RETENTION_DAYS=1)
def test_retention_shorter_than_the_retry_deadline_is_e008():
    with override_settings(TICK_RETRY_DEADLINE_S=86_401):
        assert _ids(check_pipeline_windows()) == ["tick.E008"]
    with override_settings(TICK_RETRY_DEADLINE_S=86_400):
        assert check_pipeline_windows() == []


@override_settings(TICK_RETRY_CAP_S=600)
def test_an_audit_enqueued_bound_within_the_retry_cap_is_w001():
    with override_settings(TICK_AUDIT_ENQUEUED_BOUND_S=600):
        messages = check_audit_bounds()
    with override_settings(TICK_AUDIT_ENQUEUED_BOUND_S=601):
        assert check_audit_bounds() == []

    assert _ids(messages) == ["tick.W001"]
    assert messages[0].level == checks.WARNING


def test_manage_py_check_refuses_a_bad_environment():
    env = {**os.environ, "DJANGO_DEBUG": "1", "TICK_RELAY_ENVELOPE_MAX": "0"}

    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--fail-level", "WARNING"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip

    assert result.returncode != 0
    assert "tick.E003" in result.stderr and "TICK_RELAY_ENVELOPE_MAX" in result.stderr
