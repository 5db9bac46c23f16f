from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("tenants", "0006_webhook_ports")]

    operations: list[migrations.operations.base.Operation] = []
