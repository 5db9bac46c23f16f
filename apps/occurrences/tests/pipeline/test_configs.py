"""The commands' tunables come from the settings each field names (apps/core/config.py): a
misspelt setting name would fail here, not at a process's start."""

from __future__ import annotations

from django.conf import settings

from apps.occurrences.audit.reconcile import StuckBounds
from apps.occurrences.pipeline.materializer import MaterializeConfig
from apps.occurrences.pipeline.relay import RelayConfig
from apps.occurrences.pipeline.staging import StageConfig


def test_each_config_reads_the_settings_it_names() -> None:
    materialize = MaterializeConfig.from_settings()
    relay = RelayConfig.from_settings()
    stage = StageConfig.from_settings()
    bounds = StuckBounds.from_settings()

    assert (materialize.window_s, materialize.batch_size) == (
        settings.TICK_PLANNING_WINDOW_S,
        settings.TICK_MATERIALIZE_BATCH,
    )
    assert (materialize.max_fires_per_pass, materialize.missed_record_limit) == (
        settings.TICK_MAX_FIRES_PER_PASS,
        settings.TICK_MISSED_RECORD_LIMIT,
    )
    assert (materialize.span_s, materialize.shards_total) == (
        settings.TICK_PLANNING_SPAN_S,
        settings.TICK_SHARDS,
    )
    assert (relay.lookahead_ms, relay.batch_size, relay.envelope_max) == (
        settings.TICK_RELAY_LOOKAHEAD_MS,
        settings.TICK_RELAY_BATCH,
        settings.TICK_RELAY_ENVELOPE_MAX,
    )
    assert (relay.prefix, relay.partitions) == (
        settings.TICK_QUEUE_PREFIX,
        settings.TICK_TENANT_PARTITIONS,
    )
    assert (stage.min_rows, stage.chunk_rows, stage.horizon_s, stage.max_rows) == (
        settings.TICK_RELAY_STAGE_MIN_ROWS,
        settings.TICK_RELAY_STAGE_CHUNK,
        settings.TICK_RELAY_STAGE_HORIZON_S,
        settings.TICK_RELAY_STAGE_MAX_ROWS,
    )
    assert bounds == StuckBounds(
        enqueued_s=settings.TICK_AUDIT_ENQUEUED_BOUND_S,
        scheduled_s=settings.TICK_AUDIT_SCHEDULED_BOUND_S,
        running_s=settings.TICK_AUDIT_RUNNING_BOUND_S,
        materialize_lag_s=settings.TICK_AUDIT_MATERIALIZE_LAG_S,
    )
