"""A tenant's alert history, newest first, with each alert's message (docs/alerts.md).

An alert not yet grouped into a message has no delivery: it is still pending."""

from __future__ import annotations

import uuid

from django.db.models import QuerySet

from apps.occurrences.models import Alert, AlertDelivery
from apps.tenants.models import Tenant


def alerts_history(
    *, tenant: Tenant, channel_id: uuid.UUID | None = None, event: str | None = None
) -> QuerySet[Alert]:
    """The tenant's alerts (keyset pages on `fired_at`, index alert_tenant_fired_idx)."""
    queryset = Alert.objects.filter(tenant=tenant).select_related("channel", "delivery")
    if channel_id is not None:
        queryset = queryset.filter(channel_id=channel_id)
    if event is not None:
        queryset = queryset.filter(event=event)
    return queryset


def delivery_state(alert: Alert) -> AlertDelivery.State:
    """PENDING until its message is sent (or, after its last attempt, FAILED)."""
    if alert.delivery is None:
        return AlertDelivery.State.PENDING
    return AlertDelivery.State(alert.delivery.state)
