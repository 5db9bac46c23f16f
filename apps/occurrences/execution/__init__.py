"""The worker side of an occurrence (docs/decisions.md "Execution"). Read in this order:

run.py        claim → handler → complete, for one occurrence (tasks.py calls it)
claim.py      step 1: lock, re-check, overlap policy, tenant quota, open the attempt
heartbeat.py  step 2: renew the lease while the handler runs; notice cancel or a lost lease
complete.py   step 3: record the result under the lease; retry, DEAD, wake a WAITING one
complete_batch.py  step 3, successes of ALLOW schedules: group commit per pool process (default off)
envelope_run.py  steps 1-3 for a run of an envelope's items in one slot: one claim, one completion
run_times.py  each handler's recent run times in this process (what sizes a run)
statements.py steps 1 and 3's per-occurrence statements, prepared on a direct connection,
              naming the row's day partition
reaper.py     step 4: take back attempts whose lease expired
replay.py     step 5: DEAD → RETRY_WAIT again, same id (dead-letter view)
cancel.py     cancel one occurrence, at once or cooperatively
locks.py      advisory locks, their order, the overlap lookback
requeue.py    one occurrence back through the outbox's retry lane
retry_bounds.py  attempts, deadline and the tenant's hourly retry budget
presence.py   live worker capacity and one tenant's share of it (claim's step c)
deadlines.py  an attempt's run-time limit and how a handler past it is stopped
fanout.py     an envelope's occurrences started as worker slots free up
registry.py   every handler by name, with its payload validator
handlers.py   the handler contract: context, errors and how they count
demo_handlers.py  demo and test handlers, offered only where TICK_EXTRA_HANDLERS names them
webhook.py    the webhook handler: payload and header checks, the run context
egress.py     every outbound HTTP call (handler and alert webhooks): the URL check, signing,
              the POST under one total deadline, what a status means
ssrf.py       the address rules egress.py's guard applies (resolve once, check, connect)
tasks.py, worker_consumer.py  the Celery entry points

Each module's docstring holds its part of the lock story; every step may run concurrently
with itself.
"""
