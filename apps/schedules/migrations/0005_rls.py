# Row-level security on the schedules app's tenant-owned tables (apps/tenants/rls.py).
from django.db import migrations

from apps.tenants.rls import EnableTenantRLS


class Migration(migrations.Migration):
    dependencies = [("schedules", "0004_event_kinds"), ("tenants", "0009_rls")]

    operations: list[migrations.operations.base.Operation] = [
        EnableTenantRLS("schedules_schedule"),
        EnableTenantRLS("schedules_scheduleversion"),
        EnableTenantRLS("schedules_scheduleevent"),
    ]
