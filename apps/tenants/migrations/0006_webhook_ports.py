import django.contrib.postgres.fields
import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("tenants", "0005_tenant_event")]

    operations: list[migrations.operations.base.Operation] = [
        migrations.AddField(
            model_name="tenant",
            name="webhook_allowed_ports",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.PositiveIntegerField(
                    validators=[
                        django.core.validators.MinValueValidator(1),
                        django.core.validators.MaxValueValidator(65535),
                    ]
                ),
                blank=True,
                default=list,
                help_text="Extra TCP ports (1–65535, comma-separated) webhooks may call besides "
                "80 and 443. Empty: only 80 and 443.",
                size=20,
            ),
        ),
    ]
