from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("schedules", "0004_event_kinds")]

    operations: list[migrations.operations.base.Operation] = []
