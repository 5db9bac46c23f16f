from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("occurrences", "0011_manual_runs")]

    operations: list[migrations.operations.base.Operation] = []
