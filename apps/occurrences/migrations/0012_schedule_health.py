from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("occurrences", "0011_manual_runs")]

    # The schedule list's health reads (apps/occurrences/schedule_health.py): one schedule's
    # latest occurrences across versions. On the partitioned parent, PostgreSQL creates it on
    # every day partition (and on each partition created later).
    operations = [
        migrations.AddIndex(
            model_name="occurrence",
            index=models.Index(
                fields=["schedule", "scheduled_for"], name="occurrence_schedule_time_idx"
            ),
        ),
    ]
