"""The benchmarks' CPU figures count processes that exit during a run (a PostgreSQL backend
per connection, a replaced pool process), so a service's CPU never reads negative."""

from __future__ import annotations

import subprocess
import sys
import time

import psycopg
import pytest
from django.conf import settings

from apps.bench.processes import (
    backend_cpu_diff,
    backend_cpu_seen,
    proc_cpu_s,
    services_cpu,
    tree_cpu_s,
)

# A parent that starts two children, each burning ~0.4 s of CPU, waits for them, then idles.
_TREE = """
import subprocess, sys, time
burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.4: pass"
for _ in range(2):
    subprocess.run([sys.executable, "-c", burn], check=True)
print("done", flush=True)
time.sleep(30)
"""


def test_a_tree_keeps_the_cpu_of_children_that_exited():
    parent = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE)
    try:
        samples = []
        assert parent.stdout is not None
        while True:
            samples.append(tree_cpu_s(parent.pid))
            line = parent.stdout.readline()
            if line:
                break
        after = tree_cpu_s(parent.pid)
        assert after >= 0.8 - 0.05  # both children's burn, though both have exited
        assert proc_cpu_s(parent.pid) < 0.5  # what counting the live process alone reports
        assert samples == sorted(samples) and after >= samples[-1]
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.django_db
def test_postgresql_cpu_counts_a_backend_that_has_exited():
    db = settings.DATABASES["default"]
    before = services_cpu()["postgresql"]
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"]
    ) as conn:
        started = time.monotonic()
        conn.execute("SELECT count(*) FROM generate_series(1, 3000000) a, generate_series(1, 3)")
        busy_s = time.monotonic() - started
    time.sleep(0.2)  # let the postmaster reap the backend
    spent = services_cpu()["postgresql"] - before
    # The backend is gone, its CPU is not: the query's time (it is CPU-bound) is counted.
    assert spent >= 0.5 * busy_s > 0


def test_a_backend_closed_during_the_run_counts_up_to_its_last_sample():
    first = {1: ("worker", 10.0), 9: ("relay", 4.0)}
    seen = backend_cpu_seen(first, {1: ("worker", 12.0), 2: ("worker", 0.5), 9: ("relay", 5.0)})
    last = {2: ("worker", 1.5), 3: ("worker", 0.2), 9: ("relay", 6.0)}  # 1 was replaced by 3
    seen = backend_cpu_seen(seen, last)
    # Backend 1's two seconds before it closed count; the last reading alone loses them.
    assert backend_cpu_diff(first, seen) == {"worker": 3.7, "relay": 2.0}
    assert backend_cpu_diff(first, last) == {"worker": 1.7, "relay": 2.0}
