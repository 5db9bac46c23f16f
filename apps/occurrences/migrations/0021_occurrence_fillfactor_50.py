from django.db import migrations

# The occurrence partitions that exist already get the fillfactor new ones are created with
# (pipeline/partitions.py PARTITION_FILLFACTOR, 65 -> 50); it applies to pages written from
# now on (docs/decisions.md "Delivery path: fewer writes per occurrence").
_FILLFACTOR = """
    DO $$
    DECLARE part regclass;
    BEGIN
        FOR part IN SELECT inhrelid::regclass FROM pg_inherits
                    WHERE inhparent = 'occurrences_occurrence'::regclass LOOP
            EXECUTE format('ALTER TABLE %s SET (fillfactor = 50)', part);
        END LOOP;
    END $$;
"""
_FILLFACTOR_BACK = _FILLFACTOR.replace("fillfactor = 50", "fillfactor = 65")


class Migration(migrations.Migration):

    dependencies = [
        ("occurrences", "0020_pause_after_dead"),
    ]

    operations = [
        migrations.RunSQL(_FILLFACTOR, _FILLFACTOR_BACK),
    ]
