"""The time rules import without Django: no settings, no app registry, no database
(docs/timerules.md). A subprocess, so this process's Django set-up cannot hide an import."""

from __future__ import annotations

import os
import subprocess
import sys

from django.conf import settings

_PROBE = """
import sys
import apps.schedules.timerules as tr
from datetime import UTC, datetime
after = datetime(2026, 3, 8, tzinfo=UTC)
assert tr.next_fire_times("0 9 * * *", "America/New_York", after, 1, dst_gap=tr.DstGap.SHIFT)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {"django", "rest_framework"})
print(",".join(loaded))
"""


def test_timerules_import_without_django_settings() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"Django modules loaded: {done.stdout}"


def test_the_model_names_the_options_of_the_rules() -> None:
    from apps.schedules import timerules
    from apps.schedules.models import Schedule

    assert Schedule.DstGap is timerules.DstGap
    assert Schedule.DstFold is timerules.DstFold
    assert Schedule._meta.get_field("dst_gap").choices == [("skip", "Skip"), ("shift", "Shift")]
