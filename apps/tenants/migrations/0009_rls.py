from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("tenants", "0008_members")]

    operations: list[migrations.operations.base.Operation] = []
