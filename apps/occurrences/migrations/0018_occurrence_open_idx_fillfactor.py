from django.db import migrations, models

# The occurrence partitions that exist already get the fillfactor new ones are created with
# (pipeline/partitions.py PARTITION_FILLFACTOR); it applies to pages written from now on.
_FILLFACTOR = """
    DO $$
    DECLARE part regclass;
    BEGIN
        FOR part IN SELECT inhrelid::regclass FROM pg_inherits
                    WHERE inhparent = 'occurrences_occurrence'::regclass LOOP
            EXECUTE format('ALTER TABLE %s SET (fillfactor = 65)', part);
        END LOOP;
    END $$;
"""
_FILLFACTOR_RESET = _FILLFACTOR.replace("SET (fillfactor = 65)", "RESET (fillfactor)")


class Migration(migrations.Migration):

    dependencies = [
        ("occurrences", "0017_alert_channel_confirmation"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="occurrence",
            name="occurrence_enqueued_open_idx",
        ),
        migrations.AddIndex(
            model_name="occurrence",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", True)),
                fields=["scheduled_for"],
                name="occurrence_open_idx",
            ),
        ),
        migrations.RunSQL(_FILLFACTOR, _FILLFACTOR_RESET),
    ]
