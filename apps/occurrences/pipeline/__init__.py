"""From a schedule's due instant to a message on RabbitMQ (docs/architecture.md "The path").
Read in this order:

materializer.py  due schedules → occurrences + outbox rows, next_run_at advanced (one txn)
outbox.py        the one INSERT of an outbox row, embedded by every path that queues one
relay.py         due outbox rows → published messages → enqueued_at recorded, rows deleted
staging.py       an instant of ≥ 10k rows read and built ahead of time, for the relay
broker.py        pipelined, confirmed publishing as Celery task messages
queues.py        the queue topology: lanes × tenant partitions (quorum queues)
throttle.py      per-tenant trigger and catch-up rates, shared by every relay
leases.py        shard leases, fencing generations, the heartbeat
loop.py          the process loop every role runs (leases, stop signal, one unit of work)
outages.py       riding out database and broker outages
partitions.py    the daily partitions of occurrences and attempts
redelivery.py    the backstop: republish ENQUEUED work the broker lost
bulk.py          array parameters for set-based SQL

Each module's docstring names its transaction and its locks.
"""
