import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("occurrences", "0002_attempt_open_lease_idx"),
        ("schedules", "0001_initial"),
    ]

    operations = [
        # The table was created by RunSQL (partitioned), so the constraint is dropped by name.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="occurrence",
                    name="schedule",
                    field=models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="occurrences",
                        to="schedules.schedule",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    sql="ALTER TABLE occurrences_occurrence "
                    "DROP CONSTRAINT IF EXISTS occurrences_occurrence_schedule_id_fkey;",
                    reverse_sql="ALTER TABLE occurrences_occurrence ADD CONSTRAINT "
                    "occurrences_occurrence_schedule_id_fkey FOREIGN KEY (schedule_id) "
                    "REFERENCES schedules_schedule (id) DEFERRABLE INITIALLY DEFERRED;",
                ),
            ],
        ),
    ]
