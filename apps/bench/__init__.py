"""The benchmarks: no part of the product. Installed (INSTALLED_APPS) only when settings'
TICK_BENCH is on (`make run`, `make test`; never in production), and no product module may
import it (the import-linter contract in pyproject.toml). Figures: docs/performance.md.

Commands (management/commands/bench_*.py) and the module each wraps:

burst.py       bench_burst: N occurrences due at one instant through real processes
sustained.py   bench_sustained: R occurrences due every minute for M minutes
execution_path.py  bench_sustained --workers: real workers claim and complete every one
bare_celery.py     bench_sustained --workers: bare Celery's own cost per task, the floor
outage.py      bench_outage: a control-plane outage under each misfire policy
execution.py   bench_execution: start lag with real workers (fan-out, noisy neighbour)
floor.py       bench_floor: the lean-SQL floor PostgreSQL's work is compared with
api_load.py    bench_api: the API under concurrent clients against gunicorn
api_rls.py     bench_api_rls: API latency with row-level security on and off
reconcile.py   bench_reconcile: reconciliation over many cron schedules
timerules.py   bench_timerules: cron evaluation (pure Python)
labels.py      bench_labels: the schedule list's filters over a million schedules
bulk_pause.py  bench_bulk: a bulk pause of many schedules, alone and during a strict burst

What they share:

fixtures.py    bulk setup by COPY (schedules, tenants, the bench handler)
bulk_load.py   millions of not-due schedules (bench_burst --extra-active)
processes.py   the real processes a benchmark starts, and their CPU
consumer.py    an independent AMQP consumer that counts what was delivered
pg_profile.py  what PostgreSQL did: statements, tables, WAL, CPU
sizes.py       sizes per table and index, the due scan's plan
apps.py        the app config
tests/         the benchmarks' own tests
"""
