"""Which handlers a deployment offers: `noop` and `webhook` always, the demo handler `record`
only where TICK_EXTRA_HANDLERS names it — the API, the UI and the worker agree, and the
setting is read at each lookup."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.core import checks
from django.test import override_settings
from django.utils import timezone

from apps.occurrences.execution.registry import handler_names, handler_spec
from apps.occurrences.execution.run import occurrence_execute
from apps.occurrences.models import Attempt, HandlerEffect
from apps.occurrences.schedules.forms import ScheduleForm
from apps.occurrences.tests.support.rows import occurrence, schedule
from apps.schedules.models import Schedule
from tickweb.checks import check_demo_handlers_off, check_extra_handlers

PRODUCTION = override_settings(TICK_EXTRA_HANDLERS=[])
DEMO = override_settings(TICK_EXTRA_HANDLERS=["record"])

RECORD_SCHEDULE = {
    "name": "asks for the demo handler",
    "kind": "cron",
    "expression": "0 9 * * *",
    "time_zone": "UTC",
    "handler": "record",
    "payload": {"fail": "transient"},
}


def test_production_offers_only_the_built_ins_and_a_demo_run_adds_record():
    with PRODUCTION:
        assert handler_names() == ["noop", "webhook"]
        assert handler_spec("record") is None
    with DEMO:
        assert handler_names() == ["noop", "record", "webhook"]
        assert handler_spec("record") is not None


@pytest.mark.django_db
def test_api_refuses_record_in_production_with_a_clear_400(api_a):
    with PRODUCTION:
        response = api_a.post("/api/v1/schedules", RECORD_SCHEDULE, format="json")

    assert response.status_code == 400, response.content
    [message] = response.json()["error"]["fields"]["handler"]
    assert "'record'" in message and "noop, webhook" in message
    assert not Schedule.objects.exists()


@pytest.mark.django_db
def test_api_accepts_record_where_the_setting_names_it(api_a):
    with DEMO:
        response = api_a.post("/api/v1/schedules", RECORD_SCHEDULE, format="json")

    assert response.status_code == 201, response.content
    assert response.json()["handler"] == "record"


def _form_handler_choices() -> list[str]:
    """The handlers offered, without the blank "choose one" entry (none is preselected)."""
    field = ScheduleForm().fields["handler"]
    return [value for value, _ in field.choices if value]  # type: ignore[attr-defined]


def test_the_schedule_form_lists_only_the_handlers_offered():
    with PRODUCTION:
        assert _form_handler_choices() == ["noop", "webhook"]
    with DEMO:
        assert _form_handler_choices() == ["noop", "record", "webhook"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("offered", "status", "error", "ran"),
    [
        # Refused at run time as unknown: permanent, so DEAD at once; the knob never runs.
        ([], "DEAD", "no handler registered as 'record'", False),
        (["record"], "RETRY_WAIT", "asked the record handler to fail transiently", True),
    ],
)
def test_worker_runs_record_and_its_knobs_only_where_the_setting_names_it(
    tenant_a, offered, status, error, ran
):
    # A schedule stored while `record` was offered (or before the setting changed).
    sched = schedule(tenant_a, handler="record", payload={"fail": "transient"})
    occ = occurrence(sched, timezone.now())

    with override_settings(TICK_EXTRA_HANDLERS=offered):
        summary = occurrence_execute(
            occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w"
        )

    assert summary == {"status": status, "attempt_no": 1}
    assert error in Attempt.objects.get(occurrence_id=occ.id).error_message
    assert HandlerEffect.objects.filter(occurrence_id=occ.id).exists() is ran


@pytest.mark.parametrize(
    ("names", "errors", "deploy_warnings"),
    [
        ([], [], []),
        (["record"], [], ["tick.W002"]),
        (["recrod"], ["tick.E009"], []),
        (["noop"], ["tick.E009"], []),
    ],
)
def test_check_refuses_a_name_that_is_no_demo_handler_and_deploy_check_warns_of_demo_ones(
    names, errors, deploy_warnings
):
    with override_settings(TICK_EXTRA_HANDLERS=names):
        found = check_extra_handlers()
        deploy = check_demo_handlers_off()

    assert [(m.id, m.level) for m in found] == [(i, checks.ERROR) for i in errors]
    assert [(m.id, m.level) for m in deploy] == [(i, checks.WARNING) for i in deploy_warnings]


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({"DJANGO_DEBUG": "0"}, []),
        ({"DJANGO_DEBUG": "1"}, ["record"]),
        ({"DJANGO_DEBUG": "1", "TICK_EXTRA_HANDLERS": ""}, []),
        ({"DJANGO_DEBUG": "0", "TICK_EXTRA_HANDLERS": " record , "}, ["record"]),
    ],
)
def test_setting_defaults_by_debug_mode_and_the_environment_overrides_both(environment, expected):
    env = {k: v for k, v in os.environ.items() if k != "TICK_EXTRA_HANDLERS"}
    env.update(SECRET_KEY="s" * 50, **environment)
    code = "import json, tickweb.settings as s; print(json.dumps(s.TICK_EXTRA_HANDLERS))"

    result = subprocess.run(
        [sys.executable, "-c", code], cwd=settings.BASE_DIR, env=env, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == expected
