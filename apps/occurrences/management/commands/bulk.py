from __future__ import annotations

import logging
from typing import Any

from apps.occurrences.bulk_changes import bulk_step
from apps.occurrences.management.commands._loop_command import LoopCommand, LoopWork
from apps.occurrences.pipeline.loop import process_owner


class Command(LoopCommand):
    help = (
        "Work bulk changes (POST /api/v1/schedules/bulk): a batch of schedules at a time, each "
        "through the single verb's service; a killed process's job is resumed (loop)."
    )
    role = "bulk"
    logger = logging.getLogger("tick.bulk")
    once_help = "one batch, then exit"

    def work(self, options: dict[str, Any]) -> LoopWork:
        owner = process_owner(self.role)
        return LoopWork(unit=lambda: bulk_step(owner=owner))
