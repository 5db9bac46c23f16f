"""The PostgreSQL profile and the lean-SQL floor a benchmark prints beside its figures."""

from __future__ import annotations

import pytest

from apps.bench.floor import (
    DELIVERY_PHASES,
    EXECUTION_PHASES,
    FloorReport,
    PhaseCost,
    bench_floor,
)
from apps.bench.pg_profile import Phase, Profile, phase_of, profile_read, profile_reset
from apps.bench.sustained import PgWork
from apps.occurrences.models import Occurrence
from apps.occurrences.pipeline import materializer, relay
from apps.tenants.models import Tenant


def _normalised(statement: str) -> str:
    """As pg_stat_statements shows a statement: parameters as $n."""
    n = 0
    while "%s" in statement:
        n += 1
        statement = statement.replace("%s", f"${n}", 1)
    return statement


def test_tick_s_own_statements_are_counted_in_their_phase():
    assert phase_of(materializer.SELECT_DUE) == Phase.MATERIALIZE
    assert phase_of(materializer._INSERT_OCCURRENCES) == Phase.MATERIALIZE
    assert phase_of(materializer._INSERT_NEW_OCCURRENCES) == Phase.MATERIALIZE
    assert phase_of(materializer._ADVANCE) == Phase.MATERIALIZE
    assert phase_of(relay._RECORD) == Phase.RELAY
    assert phase_of("INSERT INTO occurrences_attempt (id) VALUES ($1)") == Phase.CLAIM
    completion = _normalised(
        "UPDATE occurrences_occurrence SET state = %s, finished_at = %s WHERE id = %s"
    )
    assert phase_of(completion) == Phase.COMPLETE
    assert phase_of("UPDATE occurrences_attempt SET finished_at = $1") == Phase.COMPLETE
    assert phase_of("SELECT pg_current_wal_lsn()::text") == Phase.BENCH


def _floor(server_us: dict[str, float], wal: dict[str, float]) -> FloorReport:
    phases = {
        name: PhaseCost(rows=10, seconds=1.0, backend_us=server_us[name],
                        server_us=server_us[name], wal_bytes=wal[name])
        for name in DELIVERY_PHASES + EXECUTION_PHASES
    }  # fmt: skip
    return FloorReport(occurrences=10, executed=10, phases=phases, occurrence_hot_share=None)


def test_the_work_per_occurrence_is_a_ratio_of_the_floor_s_delivery_path():
    floor = _floor(
        {"materialize": 50, "relay": 25, "claim": 500, "complete": 500},
        {"materialize": 2048, "relay": 1024, "claim": 800, "complete": 900},
    )
    work = PgWork.of(
        cpu_s=30.0, wal_bytes=600_000_000, wal_fpi=45_000, enqueued=100_000,
        floor=floor,
    )  # fmt: skip
    assert work.cpu_us == 300.0 and work.wal_bytes == 6000
    assert work.floor_cpu_us == 75 and work.cpu_ratio == 4.0
    assert work.wal_ratio == round(6000 / 3072, 2)
    assert work.wal_fpi == 0.45 and "0.45 full-page images" in work.lines()[0]
    assert "4.0x CPU" in work.lines()[0]
    idle = PgWork.of(cpu_s=1.0, wal_bytes=10, wal_fpi=0, enqueued=0, floor=None)
    assert idle.cpu_us is None and idle.lines() == ["  PostgreSQL per occurrence: nothing enqueued"]


@pytest.mark.django_db(transaction=True)
def test_the_floor_runs_the_whole_lifecycle_and_leaves_nothing_behind():
    tenants = Tenant.objects.count()
    occurrences = Occurrence.objects.count()
    report = bench_floor(occurrences=300, executed=20)
    assert report.occurrences == 300 and report.executed == 20
    assert report.phases["relay"].rows == 300
    assert report.phases["claim"].rows == report.phases["complete"].rows == 20
    for cost in report.phases.values():
        assert cost.wal_bytes > 0 and cost.server_us >= 0
    assert report.occurrence_hot_share is not None  # the floor updates occurrence rows
    assert Tenant.objects.count() == tenants and Occurrence.objects.count() == occurrences
    assert any(line.startswith("  delivery ") for line in report.lines())


@pytest.mark.django_db(transaction=True)
def test_the_floor_s_batched_execution_claims_and_completes_every_row_of_each_batch():
    occurrences = Occurrence.objects.count()
    report = bench_floor(occurrences=60, executed=10, execution_batch=4)
    assert report.executed == 10 and report.execution_batch == 4
    # ten rows more, in batches of 4, 4 and 2
    assert report.phases["claim batched"].rows == report.phases["complete batched"].rows == 10
    assert report.phases["claim batched"].wal_bytes > 0
    assert any(line.startswith("  execution 4 at a time: ") for line in report.lines())
    assert Occurrence.objects.count() == occurrences


@pytest.mark.django_db(transaction=True)
def test_the_profile_counts_updates_and_wal_since_its_reset():
    bench_floor(occurrences=50, executed=0)  # rows to be counted, then removed
    profile_reset()
    before = profile_read()
    report = bench_floor(occurrences=100, executed=10, execution_batch=3)
    after = profile_read()
    table = after.tables["occurrences_occurrence"]
    # 100 relayed; 10 claimed and completed one at a time, 10 more three at a time; the
    # reset left the earlier run's out.
    assert table.inserted == 100 and table.updated == 140
    assert after.tables["occurrences_attempt"].inserted == 20
    assert before.wal.bytes <= after.wal.bytes and after.wal.records > 0
    assert report.occurrences == 100
    lines = Profile(after.statements_available, after.statements, after.tables, after.wal).lines()
    assert lines[0].startswith("  WAL: ")


def test_execution_statements_are_counted_in_claim_and_complete():
    # The claim's locks and its count of the tenant's open attempts, the completion's lease
    # check: without these patterns they fell into "other" and the split of the workers'
    # backend CPU between claim and complete missed them.
    assert phase_of("SELECT pg_advisory_xact_lock($1, $2)") == Phase.CLAIM
    assert (
        phase_of("SELECT count(*) FROM occurrences_attempt WHERE tenant_id = $1::uuid")
        == Phase.CLAIM
    )
    assert (
        phase_of("SELECT $1 FROM occurrences_attempt WHERE id = $2::uuid AND lease_token = $3")
        == Phase.COMPLETE
    )
