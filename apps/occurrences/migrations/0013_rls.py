# Row-level security on the occurrences app's tenant-owned tables (apps/tenants/rls.py).
# The two partitioned tables get it on the parent, which is what every query names; each
# partition gets deny-all row-level security of its own against direct reads.
from django.db import migrations

from apps.tenants.rls import EnableTenantRLS, PartitionsRLS


class Migration(migrations.Migration):
    dependencies = [("occurrences", "0012_schedule_health"), ("tenants", "0009_rls")]

    operations: list[migrations.operations.base.Operation] = [
        EnableTenantRLS("occurrences_occurrence"),
        EnableTenantRLS("occurrences_attempt"),
        EnableTenantRLS("occurrences_dispatchoutbox"),
        EnableTenantRLS("occurrences_handlereffect"),
        EnableTenantRLS("occurrences_retrybudget"),
        EnableTenantRLS("occurrences_tenantactivity"),
        EnableTenantRLS("occurrences_tenantratebucket"),
        PartitionsRLS(),
    ]
