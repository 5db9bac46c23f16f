"""The benchmarks are no part of a production deployment: its settings list no bench app."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# A production environment: DEBUG off, a real-looking key, nothing said about benchmarks.
PRODUCTION = {"DJANGO_DEBUG": "0", "SECRET_KEY": "k" * 60}


def _installed_apps(**env: str) -> list[str]:
    """INSTALLED_APPS as a fresh interpreter reads tickweb/settings.py under `env` (the
    settings module is read once per process, so never in this one)."""
    clean = {k: v for k, v in os.environ.items() if k not in {"DJANGO_DEBUG", "TICK_BENCH"}}
    code = "import json, tickweb.settings as s; print(json.dumps(s.INSTALLED_APPS))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return list(json.loads(out.stdout))


def test_production_settings_list_no_bench_app():
    apps = _installed_apps(**PRODUCTION)
    assert "apps.occurrences" in apps
    assert not [app for app in apps if "bench" in app]


@pytest.mark.parametrize(
    "env",
    [{"DJANGO_DEBUG": "1"}, {**PRODUCTION, "TICK_BENCH": "1"}],
    ids=["development", "asked-for"],
)
def test_the_bench_app_is_installed_when_asked_for_or_in_development(env):
    assert "apps.bench" in _installed_apps(**env)


def test_development_may_leave_it_out():
    assert "apps.bench" not in _installed_apps(DJANGO_DEBUG="1", TICK_BENCH="0")
