from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("occurrences", "0012_schedule_health")]

    operations: list[migrations.operations.base.Operation] = []
