from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.bench.sustained import WorkerPlan, bench_sustained, report_json

# The options passed on to bench_sustained, each stored under the parameter's own name.
SUSTAINED_PARAMETERS = (
    "per_minute",
    "minutes",
    "flexible_share",
    "tenants",
    "materializers",
    "relays",
    "lead_s",
    "warmup_minutes",
    "floor",
)


class Command(BaseCommand):
    help = (
        "Sustained benchmark: R occurrences due every minute for M minutes (strict and "
        "flexible), real materialize and relay processes, an independent consumer or (with "
        "--workers) Celery workers running noop beside bare Celery; per-minute lag, CPU, WAL "
        "and table growth, then reconciliation. Last line: one JSON object."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--per-minute", type=int, required=True, help="occurrences due")
        parser.add_argument("--minutes", type=int, required=True, help="measured minutes")
        parser.add_argument("--flexible-share", type=float, default=0.5, help="0 to 1")
        parser.add_argument("--tenants", type=int, default=100)
        parser.add_argument("--materializers", type=int, default=2, help="processes")
        parser.add_argument("--relays", type=int, default=2, help="processes")
        parser.add_argument(
            "--lead", dest="lead_s", metavar="LEAD", type=float, default=90.0,
            help="seconds from the start to the first measured minute (loading, warm-up)",
        )  # fmt: skip
        parser.add_argument(
            "--warmup-minutes", type=int, default=0,
            help="whole minutes run before measuring (5: flexible at its steady rate)",
        )  # fmt: skip
        parser.add_argument(
            "--no-floor", dest="floor", action="store_false",
            help="skip the lean-SQL floor run first (no ratio to it in the report)",
        )  # fmt: skip
        parser.add_argument(
            "--workers", type=int, default=0,
            help="Celery workers executing every occurrence with the noop handler (0: an "
            "independent consumer takes the messages, delivery only)",
        )  # fmt: skip
        parser.add_argument("--concurrency", type=int, default=2, help="slots per worker")
        parser.add_argument(
            "--bare-tasks", type=int, default=None,
            help="with --workers: tasks of bare Celery (apply_async -> noop) run afterwards on "
            "the same broker as the floor; default one minute at --per-minute, 0 skips it",
        )  # fmt: skip
        parser.add_argument(
            "--relay-stall", nargs=2, type=float, metavar=("MINUTE", "SECONDS"), default=None,
            help="stop the relays (SIGSTOP) for SECONDS from measured minute MINUTE, then let "
            "them go on, and report how long they take to catch up",
        )  # fmt: skip
        parser.add_argument("--json", action="store_true", help="only the JSON line")

    def handle(self, *args: Any, **options: Any) -> None:
        quiet = options["json"]
        bare = options["bare_tasks"]
        execution = WorkerPlan(
            workers=options["workers"], concurrency=options["concurrency"],
            bare_tasks=options["per_minute"] if bare is None else bare,
        )  # fmt: skip
        report = bench_sustained(
            **{name: options[name] for name in SUSTAINED_PARAMETERS},
            execution=execution,
            relay_stall=(
                (int(options["relay_stall"][0]), options["relay_stall"][1])
                if options["relay_stall"]
                else None
            ),
            log=None if quiet else self.stdout.write,
        )
        if not quiet:
            for line in report.lines():
                self.stdout.write(line)
        self.stdout.write(report_json(report))
