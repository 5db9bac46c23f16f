"""API load benchmark (wrapped by `manage.py bench_api`; docs/performance.md "API under load").

The web server is started as the Procfile's `web:` line starts it: gunicorn `tickweb.wsgi`, 2
sync workers, connected as the web role (`TICK_WEB_DATABASE_URL`, else this database logged
in as `TICK_DB_WEB_ROLE`, as `make run` sets it up), on a free local port — or an existing
one is used (`base_url`). A bench tenant and an admin API key are made with Tick's own
services (quotas lifted: the bench measures the server, not a tenant's limits) and
`schedules` schedules are COPY-loaded (`bench.fixtures`). Then, for each endpoint and each
client count, that many threads (one keep-alive urllib3 connection each) send requests
back-to-back for `seconds`: requests/s, p50/p99 latency and every non-2xx status.

With `burst` > 0, `bench_burst` runs in a thread (its real materialize and relay processes
and consumer, its own tenants) and, from `before_s` before its instant until it is
delivered, clients change the API tenant's schedules (PATCH of the rule, pause, resume)
and read them. PATCH and pause take the relay's shard barrier (`relay_shard_barrier`) and
so wait for a relay step in flight on the schedule's shard: their latency per second
relative to the instant is how long a change waits during a burst. The same change mix is
first measured for `seconds` with no burst, and the burst's own report (its p99 lag) is
kept, so the cost shows both ways.

Every row of the bench tenant, the server's (never used) queues and the server process
are removed afterwards, also on failure.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import psycopg
import urllib3
from django.conf import settings
from django.db import connection, connections
from django.utils import timezone

from apps.bench.burst import BurstReport, bench_burst
from apps.bench.fixtures import (
    BENCH_HANDLER,
    ScheduleBatch,
    bench_tenants,
    bench_tenants_delete,
    cron_definition,
)
from apps.bench.processes import (
    ROOT,
    delete_topology,
    proc_cpu_s,
    services_cpu,
    tree_cpu_s,
)
from apps.schedules.models import Schedule
from apps.tenants.models import Tenant
from apps.tenants.services import api_key_create

# Run in this order, so that read, list and preview see exactly the preloaded schedules.
ENDPOINTS = ("read", "list", "preview", "create")
# The change mix during a burst, per schedule: PATCH and pause take the relay's shard
# barrier, resume does not (its outbox rows are new), the read takes no lock at all.
CHANGE_OPS = ("patch", "pause", "resume", "read")
BARRIER_OPS = ("patch", "pause")
# Far-future yearly rules: nothing the bench creates or changes is ever due, so a burst's
# materializer never picks it up; PATCH switches between the two (a new version each time).
RULE = "0 0 1 1 *"
OTHER_RULE = "0 0 2 1 *"
WEB_WORKERS = 2  # the Procfile's
BURST_TENANTS = 10  # bench_burst's default
SERVER_START_TIMEOUT_S = 60.0
SERVER_STOP_GRACE_S = 10.0
# A request that takes longer is recorded as an error (status 0), not waited for forever.
REQUEST_TIMEOUT_S = 60.0
WARM_UP_REQUESTS = 8
NO_RESPONSE = 0


# -- figures -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One request: when it was sent (epoch seconds), how long until its response, status."""

    op: str
    sent: float
    latency_s: float
    status: int  # NO_RESPONSE: connection error or timeout

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (as bench.burst's); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Stats:
    """One endpoint at one client count. Latencies are of 2xx answers (a fast refusal would
    flatter them); `rps` counts 2xx answers; `statuses` counts every other status."""

    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    errors: int
    statuses: dict[str, int] = field(default_factory=dict)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2) if not math.isnan(seconds) else seconds


def summarize(samples: Sequence[Sample], seconds: float) -> Stats:
    ok = [s.latency_s for s in samples if s.ok]
    statuses: dict[str, int] = {}
    for sample in samples:
        if not sample.ok:
            statuses[str(sample.status)] = statuses.get(str(sample.status), 0) + 1
    return Stats(
        requests=len(samples),
        rps=round(len(ok) / seconds, 1) if seconds > 0 else float("nan"),
        p50_ms=_ms(quantile(ok, 0.5)),
        p99_ms=_ms(quantile(ok, 0.99)),
        max_ms=_ms(max(ok)) if ok else float("nan"),
        errors=len(samples) - len(ok),
        statuses=dict(sorted(statuses.items())),
    )


def timeline(samples: Iterable[Sample], instant: float) -> list[dict[str, float]]:
    """Per whole second of sending relative to `instant` (-2 = [-2 s, -1 s)): count, errors
    and p50/p99/max latency of the 2xx answers."""
    seconds: dict[int, list[Sample]] = {}
    for sample in samples:
        seconds.setdefault(math.floor(sample.sent - instant), []).append(sample)
    rows = []
    for second in sorted(seconds):
        ok = [s.latency_s for s in seconds[second] if s.ok]
        rows.append({
            "t": second, "n": len(seconds[second]), "errors": len(seconds[second]) - len(ok),
            "p50_ms": _ms(quantile(ok, 0.5)), "p99_ms": _ms(quantile(ok, 0.99)),
            "max_ms": _ms(max(ok)) if ok else float("nan"),
        })  # fmt: skip
    return rows


# -- HTTP ----------------------------------------------------------------------------------


class ApiClient:
    """One client: one keep-alive connection (gunicorn's sync workers close it after each
    answer, so it reconnects, as any client of the Procfile's server would)."""

    def __init__(self, base_url: str, key: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.pool = urllib3.PoolManager(
            maxsize=1, retries=False, timeout=urllib3.Timeout(total=REQUEST_TIMEOUT_S)
        )
        # As behind the TLS-terminating proxy of a deployment (SECURE_PROXY_SSL_HEADER_ENABLED
        # on the bench's server): no HTTPS redirect when DEBUG is off.
        self.headers = {"Authorization": f"Bearer {key}", "X-Forwarded-Proto": "https"}

    def call(
        self, op: str, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[Sample, bytes]:
        headers = dict(self.headers)
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        sent, started = time.time(), time.perf_counter()
        try:
            response = self.pool.request(
                method, self.base_url + path, body=data, headers=headers, redirect=False
            )
            status, content = response.status, response.data
        except urllib3.exceptions.HTTPError as exc:
            status, content = NO_RESPONSE, str(exc).encode()
        return Sample(op, sent, time.perf_counter() - started, status), content

    def close(self) -> None:
        self.pool.clear()


def endpoint_request(op: str, ids: Sequence[str], n: int) -> tuple[str, str, dict[str, Any] | None]:
    """(method, path, body) of request `n` of endpoint `op`; ids are the preloaded schedules'."""
    schedule = ids[n % len(ids)]
    if op == "read":
        return "GET", f"/api/v1/schedules/{schedule}", None
    if op == "list":
        return "GET", "/api/v1/schedules", None  # the first page, newest first
    if op == "preview":
        return "GET", f"/api/v1/schedules/{schedule}/preview", None  # the next 10 fires
    if op == "create":
        body = {"name": f"bench {n}", "kind": "cron", "expression": RULE, "time_zone": "UTC",
                "handler": BENCH_HANDLER}  # fmt: skip
        return "POST", "/api/v1/schedules", body
    raise ValueError(f"unknown endpoint {op!r}")


Step = Callable[[ApiClient, int, int], list[Sample]]


def drive(
    base_url: str, key: str, clients: int, stop: threading.Event, step: Step
) -> tuple[list[Sample], float]:
    """`clients` threads calling `step(client, worker, n)` (n = 0, 1, …) until `stop` is set;
    every sample and the seconds from the common start to the last answer."""
    samples: list[list[Sample]] = [[] for _ in range(clients)]
    failures: list[BaseException] = []
    start = threading.Barrier(clients + 1)

    def run(worker: int) -> None:
        client = ApiClient(base_url, key)
        try:
            start.wait()
            n = 0
            while not stop.is_set():
                samples[worker].extend(step(client, worker, n))
                n += 1
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller below
            failures.append(exc)
            stop.set()
        finally:
            client.close()

    threads = [
        threading.Thread(target=run, args=(w,), name=f"bench-api-{w}", daemon=True)
        for w in range(clients)
    ]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    if failures:
        raise failures[0]
    return [s for per in samples for s in per], elapsed


def drive_for(
    base_url: str, key: str, clients: int, seconds: float, step: Step
) -> tuple[list[Sample], float]:
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    try:
        return drive(base_url, key, clients, stop, step)
    finally:
        timer.cancel()


def endpoint_step(op: str, ids: Sequence[str], clients: int) -> Step:
    def step(client: ApiClient, worker: int, n: int) -> list[Sample]:
        method, path, body = endpoint_request(op, ids, n * clients + worker)
        return [client.call(op, method, path, body)[0]]

    return step


def change_step(ids: Sequence[str], clients: int) -> Step:
    """Each client cycles through its own share of the schedules (so no two change one
    schedule at once, which would be a 409): PATCH its rule, pause, resume, read."""
    rules: dict[str, str] = {}

    def step(client: ApiClient, worker: int, n: int) -> list[Sample]:
        own = ids[worker::clients]
        schedule = own[n % len(own)]
        rule = OTHER_RULE if rules.get(schedule, RULE) == RULE else RULE
        path = f"/api/v1/schedules/{schedule}"
        patch, _ = client.call("patch", "PATCH", path, {"expression": rule})
        if patch.ok:
            rules[schedule] = rule
        return [
            patch,
            client.call("pause", "POST", f"{path}/pause")[0],
            client.call("resume", "POST", f"{path}/resume")[0],
            client.call("read", "GET", path)[0],
        ]

    return step


# -- the web server ------------------------------------------------------------------------


def database_url(db: Mapping[str, Any], *, user: str | None = None, password: str = "") -> str:
    """A libpq URL of Django's `db` settings, optionally logged in as another `user`."""
    login = quote(user if user is not None else (db.get("USER") or ""), safe="")
    secret = password if user is not None else (db.get("PASSWORD") or "")
    if secret:
        login += ":" + quote(str(secret), safe="")
    host = db.get("HOST") or ""
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgresql://{login}@{host}{port}/{quote(db['NAME'], safe='')}"


def web_database_url() -> tuple[str, str]:
    """What the Procfile's web line connects with, and how it was chosen:
    `TICK_WEB_DATABASE_URL`; else, as `make run` writes it, this database logged in as the
    web role; else (the role cannot log in without a password) this database's own URL, and
    the RLS middleware switches to the role per request."""
    db = settings.DATABASES["default"]
    given = os.environ.get("TICK_WEB_DATABASE_URL")
    if given:
        name = urlsplit(given).path.lstrip("/")
        if name != db["NAME"]:
            raise RuntimeError(
                f"TICK_WEB_DATABASE_URL names database {name!r}, this process uses "
                f"{db['NAME']!r}: the server would not see the bench tenant"
            )
        return given, "TICK_WEB_DATABASE_URL"
    role = settings.TICK_DB_WEB_ROLE
    as_role = database_url(db, user=role)
    try:
        psycopg.connect(as_role, connect_timeout=5).close()
    except psycopg.OperationalError:
        return database_url(db), f"own role, SET ROLE {role} per request"
    return as_role, f"login as {role}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def gunicorn_argv(port: int) -> list[str]:
    """The Procfile's web command (its `.venv/bin/gunicorn`: this interpreter's)."""
    script = Path(sys.executable).with_name("gunicorn")
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "gunicorn"]
    return [
        *launcher, "tickweb.wsgi", "--bind", f"127.0.0.1:{port}",
        "--workers", str(WEB_WORKERS), "--access-logfile", "-",
    ]  # fmt: skip


class WebServer:
    """gunicorn as the Procfile runs it; its access log and errors go to `logs`."""

    def __init__(self, logs: Path, prefix: str) -> None:
        self.logs = logs
        self.prefix = prefix
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.db_login = ""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        url, self.db_login = web_database_url()
        prom = self.logs / "prom-web"
        prom.mkdir()
        self.port = free_port()
        env = {
            **os.environ, "DATABASE_URL": url, "PROMETHEUS_MULTIPROC_DIR": str(prom),
            "TICK_QUEUE_PREFIX": self.prefix, "SECURE_PROXY_SSL_HEADER_ENABLED": "1",
            "PYTHONUNBUFFERED": "1",
        }  # fmt: skip
        self.proc = subprocess.Popen(  # noqa: S603 - fixed argv: this interpreter's gunicorn
            gunicorn_argv(self.port), cwd=ROOT, env=env,
            stdout=(self.logs / "web-access.log").open("wb"),
            stderr=(self.logs / "web.log").open("wb"),
        )  # fmt: skip

    def wait_ready(self, timeout_s: float = SERVER_START_TIMEOUT_S) -> None:
        """Until `/readyz` answers 200 (the database is reachable); raises if the server
        exits or does not answer within `timeout_s`."""
        assert self.proc is not None
        pool = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(total=2.0))
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"the web server exited ({self.proc.returncode}); see {self.logs}/web.log"
                    )
                try:
                    response = pool.request(
                        "GET", f"{self.base_url}/readyz",
                        headers={"X-Forwarded-Proto": "https"}, redirect=False,
                    )  # fmt: skip
                    if response.status == 200:
                        return
                except urllib3.exceptions.HTTPError:
                    pass
                time.sleep(0.2)
        finally:
            pool.clear()
        raise RuntimeError(f"the web server did not get ready in {timeout_s:.0f} s")

    def cpu_s(self) -> float:
        """The master's and its workers' CPU seconds so far (the whole process tree)."""
        return tree_cpu_s(self.proc.pid) if self.proc is not None else 0.0

    def stop(self) -> None:
        """SIGTERM (gunicorn's graceful stop: the workers finish their request), then kill."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=SERVER_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- setup and cleanup ---------------------------------------------------------------------


def bench_api_tenant(prefix: str) -> tuple[uuid.UUID, str]:
    """A tenant (Tick's services) with every quota the API checks lifted, and its admin key."""
    (tenant_id,) = bench_tenants(prefix, 1)
    Tenant.objects.filter(id=tenant_id).update(
        api_rate_per_min=1_000_000_000, max_active_schedules=1_000_000_000
    )
    _, raw = api_key_create(actor="bench", tenant=Tenant.objects.get(id=tenant_id), name="bench")
    return tenant_id, raw


def preload_schedules(tenant_id: uuid.UUID, count: int) -> list[str]:
    """COPY `count` yearly schedules (RULE) of the tenant; their ids as text."""
    now = timezone.now()
    next_run_at = datetime(now.year + 1, 1, 1, tzinfo=UTC)
    definition = cron_definition(RULE, precision=Schedule.Precision.STRICT, window_s=0)
    ids = [uuid.uuid4() for _ in range(count)]
    batch = ScheduleBatch()
    for sid in ids:
        batch.add_schedule(
            sid, tenant_id, expression=RULE, time_zone="UTC",
            precision=Schedule.Precision.STRICT, flexible_window_s=0,
            next_run_at=next_run_at, created_at=now, definition=definition,
        )  # fmt: skip
        batch.add_created_event(sid, tenant_id, now)
    with connection.cursor() as cursor:
        batch.copy(cursor)
        cursor.execute("ANALYZE schedules_schedule")
    return [str(sid) for sid in ids]


# The API's own rows of a tenant (its rate window, keys, idempotency keys, account
# events, signing secrets), before bench_tenants_delete removes the scheduling rows.
_API_TENANT_DELETES = (
    "DELETE FROM tenants_apiratewindow WHERE tenant_id = %s",
    "DELETE FROM tenants_apikey WHERE tenant_id = %s",
    "DELETE FROM tenants_idempotencykey WHERE tenant_id = %s",
    "DELETE FROM tenants_tenantevent WHERE tenant_id = %s",
    "DELETE FROM tenants_signingsecret WHERE tenant_id = %s",
)


def bench_api_tenant_delete(tenant_id: uuid.UUID) -> None:
    with connection.cursor() as cursor:
        for statement in _API_TENANT_DELETES:
            cursor.execute(statement, [tenant_id])
    bench_tenants_delete([tenant_id])


# -- the benchmark -------------------------------------------------------------------------


@dataclass
class ApiLoadReport:
    base_url: str
    own_server: bool
    web_workers: int
    db_login: str
    schedules: int
    seconds: float
    clients: list[int]
    # endpoint -> client count (as text, JSON keys) -> Stats as a dict
    endpoints: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # endpoint -> client count -> CPU ms per 2xx answer, per process kind
    cpu_ms_per_request: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    during_burst: dict[str, Any] | None = None

    def lines(self) -> list[str]:
        server = "started here" if self.own_server else "given"
        out = [
            f"api: {self.base_url} ({server}, {self.web_workers} gunicorn workers, database: "
            f"{self.db_login}); {self.schedules:,} schedules preloaded; {self.seconds:g} s per "
            "run",
            f"  {'endpoint':<9}{'clients':>8}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
            f"{'max ms':>9}{'errors':>8}  cpu ms/req",
        ]
        for op, per_clients in self.endpoints.items():
            for clients, stats in per_clients.items():
                cpu = self.cpu_ms_per_request.get(op, {}).get(clients, {})
                out.append(
                    f"  {op:<9}{clients:>8}{stats['rps']:>9.1f}{stats['p50_ms']:>9.1f}"
                    f"{stats['p99_ms']:>9.1f}{stats['max_ms']:>9.1f}{stats['errors']:>8}  "
                    + " ".join(f"{k} {v:.2f}" for k, v in cpu.items())
                    + (f"  statuses {stats['statuses']}" if stats["statuses"] else "")
                )
        if self.during_burst is not None:
            out.extend(_burst_lines(self.during_burst))
        return out


def _burst_lines(during: dict[str, Any]) -> list[str]:
    out = [
        f"during a burst of {during['burst_schedules']:,} strict schedules: "
        f"{during['clients']} clients doing PATCH, pause, resume, read per schedule",
        f"  {'op':<8}{'no burst p50/p99/max ms':>26}{'burst p50/p99/max ms':>26}{'errors':>8}",
    ]
    for op in CHANGE_OPS:
        base, burst = during["baseline"][op], during["ops"][op]
        out.append(
            f"  {op:<8}{_triple(base):>26}{_triple(burst):>26}{burst['errors']:>8}"
            + (f"  statuses {burst['statuses']}" if burst["statuses"] else "")
        )
    out.append("  PATCH + pause by second from the instant (t, n, p50/p99/max ms):")
    out.extend(
        f"    {row['t']:>+4} s {row['n']:>5}  {row['p50_ms']:.1f}/{row['p99_ms']:.1f}/"
        f"{row['max_ms']:.1f}" + (f"  errors {row['errors']}" if row["errors"] else "")
        for row in during["changes_by_second"]
    )
    burst = during["burst"]
    out.append(
        f"  the burst: lag p50 {burst['p50_s']:.3f} s  p99 {burst['p99_s']:.3f} s  max "
        f"{burst['max_s']:.3f} s, missing {burst['missing']}, throughput "
        f"{burst['throughput_per_s']:,.0f}/s"
    )
    return out


def _triple(stats: dict[str, Any]) -> str:
    return f"{stats['p50_ms']:.1f}/{stats['p99_ms']:.1f}/{stats['max_ms']:.1f}"


def _warm_up(base_url: str, key: str, ids: Sequence[str], ops: Iterable[str]) -> None:
    """A few requests of each endpoint on two clients, so both workers have loaded the code
    and opened their database connection; a failing endpoint stops the bench here."""
    client = ApiClient(base_url, key)
    try:
        for op in ops:
            for n in range(WARM_UP_REQUESTS):
                sample, body = client.call(op, *endpoint_request(op, ids, n))
                if not sample.ok:
                    raise RuntimeError(f"warm-up {op} answered {sample.status}: {body[:300]!r}")
    finally:
        client.close()


def _measure_endpoint(
    base_url: str, key: str, ids: Sequence[str], op: str, clients: int, seconds: float,
    server: WebServer | None,
) -> tuple[Stats, dict[str, float]]:  # fmt: skip
    """The run's figures and CPU ms per answered request: the server's process tree (when
    started here), the services (whole PostgreSQL and RabbitMQ, so whatever else runs on the
    machine counts too) and this process, the clients (`bench`), which share the machine."""
    web_before = server.cpu_s() if server else 0.0
    services_before, bench_before = services_cpu(), proc_cpu_s(os.getpid())
    samples, elapsed = drive_for(base_url, key, clients, seconds, endpoint_step(op, ids, clients))
    stats = summarize(samples, elapsed)
    answered = max(1, len(samples) - stats.statuses.get(str(NO_RESPONSE), 0))
    cpu = {name: after - services_before[name] for name, after in services_cpu().items()}
    cpu["bench"] = proc_cpu_s(os.getpid()) - bench_before
    if server is not None:
        cpu = {"web": server.cpu_s() - web_before, **cpu}
    return stats, {name: round(1000 * s / answered, 2) for name, s in cpu.items()}


def _changes_during_burst(
    base_url: str, key: str, ids: Sequence[str], *, burst_schedules: int, clients: int,
    seconds: float, lead_s: float, before_s: float, timeout_s: float,
    say: Callable[[str], object],
) -> dict[str, Any]:  # fmt: skip
    say(f"changes without a burst, {clients} clients, {seconds:g} s…")
    step = change_step(ids, clients)
    samples, _ = drive_for(base_url, key, clients, seconds, step)
    baseline = {op: summarize([s for s in samples if s.op == op], seconds) for op in CHANGE_OPS}

    started, delivered = threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    def on_started(instant: datetime) -> None:
        box["instant"] = instant
        started.set()

    def run_burst() -> None:
        try:
            box["report"] = bench_burst(
                schedules=burst_schedules, tenants=BURST_TENANTS, lead_s=lead_s,
                timeout_s=timeout_s, log=say, on_started=on_started,
                on_delivered=delivered.set,
            )  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            box["error"] = exc
        finally:
            started.set()
            delivered.set()
            connections.close_all()  # this thread's own connection

    burster = threading.Thread(target=run_burst, name="bench-burst", daemon=True)
    burster.start()
    try:
        started.wait()
        if "error" in box:
            raise box["error"]
        instant: datetime = box["instant"]
        time.sleep(max(0.0, instant.timestamp() - before_s - time.time()))
        say(f"changes from {before_s:g} s before the instant until the burst is delivered…")
        samples, window_s = drive(base_url, key, clients, delivered, step)
    finally:
        burster.join()
    if "error" in box:
        raise box["error"]
    report: BurstReport = box["report"]
    changes = [s for s in samples if s.op in BARRIER_OPS]
    return {
        "burst_schedules": burst_schedules,
        "clients": clients,
        "before_s": before_s,
        "window_s": round(window_s, 1),
        "baseline": {op: asdict(stats) for op, stats in baseline.items()},
        "ops": {
            op: asdict(summarize([s for s in samples if s.op == op], window_s)) for op in CHANGE_OPS
        },
        "changes_by_second": timeline(changes, instant.timestamp()),
        "reads_by_second": timeline([s for s in samples if s.op == "read"], instant.timestamp()),
        "burst": asdict(report),
    }


def bench_api(
    *,
    schedules: int = 1000,
    clients: Sequence[int] = (1, 8, 32),
    seconds: float = 10.0,
    endpoints: Sequence[str] = ENDPOINTS,
    base_url: str | None = None,
    during_burst: int = 0,
    burst_clients: int = 4,
    burst_lead_s: float = 60.0,
    burst_before_s: float = 10.0,
    burst_timeout_s: float = 120.0,
    log: Callable[[str], object] | None = None,
) -> ApiLoadReport:
    say = log or (lambda message: None)
    if schedules < max(1, burst_clients if during_burst else 1):
        raise ValueError("--schedules must be at least 1 (and at least --burst-clients)")
    prefix = f"tick-bench-{uuid.uuid4().hex[:8]}"
    logs = Path(tempfile.mkdtemp(prefix="tick-bench-api-"))
    server = None if base_url else WebServer(logs, prefix)
    tenant_id: uuid.UUID | None = None
    try:
        if server is not None:
            server.start()  # boots while the schedules load
            say(f"web server on {server.base_url}, logs in {logs}")
        tenant_id, key = bench_api_tenant(prefix)
        say(f"loading {schedules:,} schedules…")
        ids = preload_schedules(tenant_id, schedules)
        if server is not None:
            server.wait_ready()
        url = server.base_url if server is not None else str(base_url)
        _warm_up(url, key, ids, [op for op in endpoints if op != "create"])
        report = ApiLoadReport(
            base_url=url, own_server=server is not None, web_workers=WEB_WORKERS,
            db_login=server.db_login if server is not None else "the given server's",
            schedules=schedules, seconds=seconds, clients=list(clients),
        )  # fmt: skip
        for op in endpoints:
            for count in clients:
                say(f"{op}: {count} client(s), {seconds:g} s…")
                stats, cpu = _measure_endpoint(url, key, ids, op, count, seconds, server)
                report.endpoints.setdefault(op, {})[str(count)] = asdict(stats)
                report.cpu_ms_per_request.setdefault(op, {})[str(count)] = cpu
        if during_burst:
            report.during_burst = _changes_during_burst(
                url, key, ids, burst_schedules=during_burst, clients=burst_clients,
                seconds=seconds, lead_s=burst_lead_s, before_s=burst_before_s,
                timeout_s=burst_timeout_s, say=say,
            )  # fmt: skip
        return report
    finally:
        say("cleaning up…")
        if server is not None:
            server.stop()
        if tenant_id is not None:
            bench_api_tenant_delete(tenant_id)
        delete_topology(settings.CELERY_BROKER_URL, prefix)


def report_json(report: ApiLoadReport) -> str:
    return json.dumps(asdict(report), sort_keys=True)
