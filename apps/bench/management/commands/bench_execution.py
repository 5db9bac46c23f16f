from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.bench.execution import (
    LEAD_S,
    ExecutionReport,
    NoisyPlan,
    Pool,
    bench_fan_out,
    bench_noisy_neighbour,
    report_json,
)
from apps.bench.fixtures import BENCH_HANDLER
from apps.occurrences.execution.registry import handler_spec

FAN_OUT = "fan-out"
NOISY = "noisy"
SCENARIOS = (FAN_OUT, NOISY)
ALL = "all"


class Command(BaseCommand):
    help = (
        "Execution benchmark: start lag of handlers under a burst (fan-out) and under a noisy "
        "tenant (noisy), with real materialize, relay, reap and worker processes. Last line: "
        "one JSON object."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--scenario", choices=(*SCENARIOS, ALL), default=ALL)
        parser.add_argument("--workers", type=int, default=2, help="worker processes")
        parser.add_argument("--concurrency", type=int, default=2, help="slots per worker")
        parser.add_argument(
            "--lead",
            dest="lead_s",
            type=float,
            default=LEAD_S,
            help="seconds from loading a scenario's schedules (processes up) to their first "
            "instant, at least: it is the next whole minute after",
        )
        parser.add_argument("--json", action="store_true", help="only the JSON line")
        fan_out = parser.add_argument_group("fan-out")
        fan_out.add_argument("--occurrences", type=int, default=200)
        fan_out.add_argument(
            "--handler-sleep",
            dest="sleep_s",
            type=float,
            default=1.0,
            help="seconds each handler runs",
        )
        fan_out.add_argument(
            "--timeout",
            dest="timeout_s",
            type=float,
            default=None,
            help="seconds after the instant to wait for the last one",
        )
        noisy = parser.add_argument_group("noisy")
        noisy.add_argument("--minutes", type=int, default=5)
        noisy.add_argument(
            "--flood-factor",
            type=int,
            default=10,
            help="tenant N's schedules per minute, in shares of the slots",
        )
        noisy.add_argument(
            "--runaway-timeout",
            dest="runaway_timeout_s",
            type=int,
            default=2,
            help="timeout_s of N's schedules",
        )
        noisy.add_argument(
            "--runaway-sleep",
            dest="runaway_sleep_s",
            type=float,
            default=30.0,
            help="seconds N's handlers would sleep",
        )
        noisy.add_argument(
            "--drain",
            dest="drain_s",
            type=float,
            default=60.0,
            help="seconds after the last minute to wait for quiet tenants",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if handler_spec(BENCH_HANDLER) is None:
            raise CommandError(
                f"the {BENCH_HANDLER!r} handler is not offered in these settings: run the "
                f"benchmark with DJANGO_DEBUG=1 or TICK_EXTRA_HANDLERS={BENCH_HANDLER}"
            )
        say = (lambda message: None) if options["json"] else self.stdout.write
        pool = Pool(workers=options["workers"], concurrency=options["concurrency"])
        scenarios = SCENARIOS if options["scenario"] == ALL else (options["scenario"],)
        report = ExecutionReport()
        if FAN_OUT in scenarios:
            report.fan_out = bench_fan_out(
                pool=pool, occurrences=options["occurrences"], sleep_s=options["sleep_s"],
                lead_s=options["lead_s"], timeout_s=options["timeout_s"], say=say,
            )  # fmt: skip
        if NOISY in scenarios:
            plan = NoisyPlan(
                minutes=options["minutes"], slots=pool.slots,
                flood_factor=options["flood_factor"],
                runaway_timeout_s=options["runaway_timeout_s"],
                runaway_sleep_s=options["runaway_sleep_s"],
            )  # fmt: skip
            report.noisy_neighbour = bench_noisy_neighbour(
                pool=pool, plan=plan, lead_s=options["lead_s"], drain_s=options["drain_s"],
                say=say,
            )  # fmt: skip
        for line in [] if options["json"] else report.lines():
            self.stdout.write(line)
        self.stdout.write(report_json(report))
