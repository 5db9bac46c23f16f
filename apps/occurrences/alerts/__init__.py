"""Alerts: events a tenant's rules match, grouped per channel and sent by the workers
(docs/alerts.md)."""
