# The due cursor: `schedules_due` holds (shard, next_run_at, schedule_id) of every ACTIVE
# schedule with an instant left, under one index; triggers on schedules_schedule keep it
# equal to the schedules' own columns, and `schedule_due_idx` goes, so an advance of
# `next_run_at` is a HOT update of the wide row (docs/decisions.md "The due cursor").
from django.conf import settings
from django.db import migrations

WEB_ROLE = settings.TICK_DB_WEB_ROLE

_ACTIVE_ROWS = "state = 'ACTIVE' AND next_run_at IS NOT NULL"
_CHANGED = "(n.state, n.next_run_at, n.shard) IS DISTINCT FROM (o.state, o.next_run_at, o.shard)"

# SECURITY DEFINER: the web role changes schedules but has no privilege on the cursor.
# enable_seqscan off: a plpgsql plan is made once per session, from whatever the first
# transition table held; the cursor must be reached through its index whatever that was.
_FUNCTION = """
CREATE OR REPLACE FUNCTION {name}() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public SET enable_seqscan = off AS $$
BEGIN
{body}
    RETURN NULL;
END $$
"""
_ON_INSERT = f"""
    INSERT INTO schedules_due (shard, next_run_at, schedule_id)
    SELECT shard, next_run_at, id FROM new_rows WHERE {_ACTIVE_ROWS}
    ON CONFLICT DO NOTHING;
"""
_ON_UPDATE = f"""
    DELETE FROM schedules_due d USING old_rows o JOIN new_rows n ON n.id = o.id
    WHERE d.shard = o.shard AND d.next_run_at = o.next_run_at AND d.schedule_id = o.id
      AND {_CHANGED};
    INSERT INTO schedules_due (shard, next_run_at, schedule_id)
    SELECT n.shard, n.next_run_at, n.id FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.state = 'ACTIVE' AND n.next_run_at IS NOT NULL AND {_CHANGED}
    ON CONFLICT DO NOTHING;
"""
_ON_DELETE = """
    DELETE FROM schedules_due d USING old_rows o
    WHERE d.shard = o.shard AND d.next_run_at = o.next_run_at AND d.schedule_id = o.id;
"""
_ON_TRUNCATE = "    TRUNCATE schedules_due;"

_TRIGGERS = [
    ("schedules_due_on_insert", _ON_INSERT, "AFTER INSERT", "REFERENCING NEW TABLE AS new_rows"),
    (
        "schedules_due_on_update",
        _ON_UPDATE,
        "AFTER UPDATE",
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows",
    ),
    ("schedules_due_on_delete", _ON_DELETE, "AFTER DELETE", "REFERENCING OLD TABLE AS old_rows"),
    ("schedules_due_on_truncate", _ON_TRUNCATE, "AFTER TRUNCATE", ""),
]

FORWARD = [
    # One index: the due scan's range per shard, and the triggers' lookup of a schedule's row
    # by its old values. No foreign key: the triggers are the only writers.
    """
    CREATE TABLE schedules_due (
        shard smallint NOT NULL,
        next_run_at timestamptz NOT NULL,
        schedule_id uuid NOT NULL,
        CONSTRAINT schedules_due_pkey PRIMARY KEY (shard, next_run_at, schedule_id)
    )
    """,
    f"""
    INSERT INTO schedules_due (shard, next_run_at, schedule_id)
    SELECT shard, next_run_at, id FROM schedules_schedule WHERE {_ACTIVE_ROWS}
    """,
    f"""
    DO $$ BEGIN
        IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{WEB_ROLE}') THEN
            REVOKE ALL ON schedules_due FROM "{WEB_ROLE}";
        END IF;
    END $$
    """,
    *[_FUNCTION.format(name=name, body=body) for name, body, _, _ in _TRIGGERS],
    *[
        f"CREATE TRIGGER {name} {event} ON schedules_schedule {transition} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {name}()"
        for name, _, event, transition in _TRIGGERS
    ],
    # Room on each page for the new version of an advanced row: the advance stays HOT.
    "ALTER TABLE schedules_schedule SET (fillfactor = 80)",
]
BACKWARD = [
    "ALTER TABLE schedules_schedule RESET (fillfactor)",
    *[f"DROP TRIGGER IF EXISTS {name} ON schedules_schedule" for name, _, _, _ in _TRIGGERS],
    *[f"DROP FUNCTION IF EXISTS {name}()" for name, _, _, _ in _TRIGGERS],
    "DROP TABLE IF EXISTS schedules_due",
]


class Migration(migrations.Migration):
    dependencies = [
        ("schedules", "0009_pause_after_dead"),
        ("tenants", "0016_pause_after_dead"),
    ]

    operations = [
        migrations.RunSQL(FORWARD, BACKWARD),
        migrations.RemoveIndex(model_name="schedule", name="schedule_due_idx"),
    ]
