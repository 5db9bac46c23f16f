"""Alerts: events a tenant's rules match, grouped per channel and sent by the workers
(docs/alerts.md). Recorded in the transaction of the change they report
(`apps/occurrences/alert_records.py`); then:

configure.py  channels and rules: validation, the tenant door, the test alert
confirm.py    an e-mail channel confirmed by its address before it receives alerts
lag.py        lag rules: start (or enqueue) lag above T seconds for N minutes
dispatch.py   recorded alerts grouped into messages (coalescing, digests), published
deliver.py    one message sent to its channel, in a worker
tasks.py      the worker's task (a thin wrapper over deliver.py)
history.py    a tenant's alert history, newest first
"""
