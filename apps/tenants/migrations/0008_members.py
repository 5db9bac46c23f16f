from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("tenants", "0007_signing_secrets")]

    operations: list[migrations.operations.base.Operation] = []
