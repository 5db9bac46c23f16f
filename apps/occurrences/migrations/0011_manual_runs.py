from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("occurrences", "0010_tenant_rate_bucket")]

    operations: list[migrations.operations.base.Operation] = []
