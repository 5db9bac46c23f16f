from django.contrib import admin

from apps.occurrences.models import DispatchOutbox, ShardLease

# Occurrence and Attempt have composite primary keys (id, scheduled_for), which Django 5.2's
# admin refuses to register; support staff read them through the occurrence API and pages.


@admin.register(DispatchOutbox)
class DispatchOutboxAdmin(admin.ModelAdmin[DispatchOutbox]):
    list_display = ["occurrence_id", "lane", "shard", "available_at", "created_at"]
    list_filter = ["lane"]
    readonly_fields = [f.name for f in DispatchOutbox._meta.fields]

    def has_add_permission(self, request: object) -> bool:
        return False


@admin.register(ShardLease)
class ShardLeaseAdmin(admin.ModelAdmin[ShardLease]):
    list_display = ["role", "shard", "owner", "generation", "lease_expires_at"]
    list_filter = ["role", "owner"]
    readonly_fields = ["role", "shard", "owner", "generation", "lease_expires_at"]
