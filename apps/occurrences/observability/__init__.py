"""What operators and tenants see of the engine (docs/operations.md "Metrics").

metrics.py         the Prometheus metrics of the delivery path
metrics_access.py  who may read the web process's /metrics
health.py          liveness and readiness per process kind
logs.py            JSON log records carrying tenant, schedule and occurrence ids
dashboard.py       the tenant dashboard's bounded reads
"""
