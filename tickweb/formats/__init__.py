"""Date formats of the Django admin: the tenant pages' one timestamp format (docs/ui.md
"Timestamps"), not the English locale's `Dec. 3, 2026, 11:52 p.m.`."""
