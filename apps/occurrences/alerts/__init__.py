"""Alerts: events a tenant's rules match, grouped per channel and sent by the workers
(docs/alerts.md). Everything of alerts is here but their models (apps/occurrences/models.py)
and their recording: ../alert_records.py writes an alert in the transaction of the change it
reports, and the pipeline and execution embed its SQL, so it stays below them (an import
from here would run up the layers). Read in this order:

configure.py   channels and rules: validation, the tenant doors, changes, the test alert
confirm.py     e-mail channels confirmed by their address before they receive alerts
lag.py         lag rules, evaluated by the reaper
dispatch.py    grouping recorded alerts into messages, publishing them (the reaper's pass)
deliver.py     one message sent by a worker; webhooks through execution/egress.py
tasks.py       the worker's Celery task (a thin wrapper over deliver.py)
history.py     a tenant's alert history, newest first

The interfaces, thin over the modules above:

api.py, api_urls.py, serializers.py  /api/v1/alert-channels, /alert-rules, /alerts
views.py, urls.py, forms.py          the Alerts page of the web UI (/alerts/)
tests/                               the alerts' tests
"""
