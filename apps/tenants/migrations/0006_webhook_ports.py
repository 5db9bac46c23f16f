from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("tenants", "0005_tenant_event")]

    operations: list[migrations.operations.base.Operation] = []
