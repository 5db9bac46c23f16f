"""What the long-running commands (materialize, relay, reap) share: the options `--once`,
`--metrics-port` and an idle sleep, and `run_loop` (pipeline/loop.py) until SIGTERM, on this
process's shard leases when the command has any. Each command only builds its unit of work.

The leading underscore keeps Django from listing this module as a command.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from django.core.management.base import BaseCommand, CommandParser

from apps.occurrences.pipeline.leases import LeaseSet
from apps.occurrences.pipeline.loop import process_owner, run_loop


@dataclass(frozen=True)
class LoopWork:
    """A command's unit of work (returns how much it did; 0 = idle) and what surrounds it."""

    unit: Callable[[], int]
    leases: LeaseSet | None = None
    # Runs at shutdown while the leases are still held (to finish fenced work).
    before_release: Callable[[], None] | None = None
    # Runs once the loop has ended, however it ended.
    close: Callable[[], None] | None = None


class LoopCommand(BaseCommand):
    role: ClassVar[str]  # names the process: owner id, metrics labels, health
    logger: ClassVar[logging.Logger]
    once_help: ClassVar[str] = "one unit of work, then exit"
    idle_sleep_flag: ClassVar[str] = "--idle-sleep"
    idle_sleep_default_s: ClassVar[float] = 1.0

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--metrics-port", type=int, default=None)
        parser.add_argument("--once", action="store_true", help=self.once_help)
        parser.add_argument(
            self.idle_sleep_flag,
            dest="idle_sleep",
            metavar="SECONDS",
            type=float,
            default=self.idle_sleep_default_s,
            help="sleep between units of work that found nothing to do",
        )

    def work(self, options: dict[str, Any]) -> LoopWork:
        raise NotImplementedError

    def handle(self, *args: Any, **options: Any) -> None:
        work = self.work(options)
        owner = work.leases.owner if work.leases is not None else process_owner(self.role)
        self.logger.info("%s %s starting", self.role, owner)
        try:
            run_loop(
                role=self.role,
                owner=owner,
                leases=work.leases,
                unit=work.unit,
                idle_sleep_s=options["idle_sleep"],
                once=options["once"],
                metrics_port=options["metrics_port"],
                before_release=work.before_release,
            )
        finally:
            if work.close is not None:
                work.close()
