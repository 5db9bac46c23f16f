"""The webhook handler against a real local HTTP server, and the SSRF guard's refusals."""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from django.utils import timezone

from apps.occurrences.execution.complete import retry_deadline
from apps.occurrences.execution.egress import retry_after_s
from apps.occurrences.execution.handlers import HandlerContext, PermanentError, TransientError
from apps.occurrences.execution.registry import handler_spec
from apps.occurrences.execution.run import occurrence_execute
from apps.occurrences.execution.ssrf import Allowlist, SSRFRefused, address_refusal, check_url
from apps.occurrences.execution.webhook import (
    WebhookPayloadError,
    validate_webhook_payload,
    webhook_send,
)
from apps.occurrences.models import Attempt, DispatchOutbox, Lane, Occurrence
from apps.occurrences.tests.support.rows import occurrence, schedule, state_of
from apps.tenants.models import Tenant
from apps.tenants.services import tenant_create

# The webhook reads its tenant's port allowlist at each send.
pytestmark = pytest.mark.django_db


class _Recorder(BaseHTTPRequestHandler):
    requests: list[dict[str, Any]]

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length)
        self.server.requests.append(  # type: ignore[attr-defined]
            {"path": self.path, "headers": dict(self.headers), "body": body}
        )
        if self.path.startswith("/sleep"):
            time.sleep(1.5)
        url = urlsplit(self.path)
        status = int(url.path.split("/status/")[1]) if "/status/" in url.path else 200
        self.send_response(status)
        if 300 <= status < 400:
            port = self.server.server_port  # type: ignore[attr-defined]
            self.send_header("Location", f"http://127.0.0.1:{port}/moved")
        for value in parse_qs(url.query).get("retry-after", []):
            self.send_header("Retry-After", value)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def _httpd() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    httpd.requests = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def server(_httpd: ThreadingHTTPServer) -> ThreadingHTTPServer:
    _httpd.requests.clear()  # type: ignore[attr-defined]
    return _httpd


@pytest.fixture
def allow_loopback(settings: Any) -> None:
    settings.TICK_WEBHOOK_ALLOWLIST = ["127.0.0.1/32"]


_hook_tenant: dict[str, uuid.UUID] = {}


@pytest.fixture(autouse=True)
def hook_tenant(db: Any, _httpd: ThreadingHTTPServer) -> Tenant:
    """The tenant of `_ctx`'s contexts, whose port allowlist opens the test server's port
    (so the SSRF vectors below are refused for their address, not for their port)."""
    tenant = tenant_create(slug="hooks", name="Hooks")
    open_ports(tenant, _httpd.server_port)
    _hook_tenant["id"] = tenant.id
    return tenant


def open_ports(tenant: Tenant, *ports: int) -> None:
    tenant.webhook_allowed_ports = [*tenant.webhook_allowed_ports, *ports]
    tenant.save(update_fields=["webhook_allowed_ports"])


def _ctx(payload: Any) -> HandlerContext:
    return HandlerContext(
        occurrence_id=uuid.uuid4(),
        schedule_id=uuid.uuid4(),
        schedule_version=1,
        tenant_id=_hook_tenant["id"],
        scheduled_for=timezone.now(),
        attempt_no=1,
        payload=payload,
    )


def _url(server: ThreadingHTTPServer, path: str = "/hook") -> str:
    return f"http://127.0.0.1:{server.server_port}{path}"


# --- delivery to an allowlisted local server --------------------------------------------


def test_webhook_posts_json_with_the_idempotency_key(server, allow_loopback, tenant_a):
    ctx = _ctx(
        {"url": _url(server, "/hook?x=1"), "body": {"n": 1}, "headers": {"X-Tenant": "a"}},
    )

    assert webhook_send(ctx=ctx) == 200

    [request] = server.requests
    assert request["path"] == "/hook?x=1"
    assert request["headers"]["Idempotency-Key"] == str(ctx.occurrence_id)
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["headers"]["X-Tenant"] == "a"
    assert request["headers"]["Host"] == f"127.0.0.1:{server.server_port}"
    assert json.loads(request["body"]) == {"n": 1}


def test_webhook_schedule_runs_through_the_worker_path(server, allow_loopback, tenant_a):
    open_ports(tenant_a, server.server_port)
    sched = schedule(tenant_a, handler="webhook", payload={"url": _url(server), "body": {"k": 2}})
    occ = occurrence(sched, timezone.now())

    summary = occurrence_execute(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, worker_id="w"
    )

    assert summary == {"status": "SUCCEEDED", "attempt_no": 1}
    assert [r["headers"]["Idempotency-Key"] for r in server.requests] == [str(occ.id)]


@pytest.mark.parametrize(
    ("status", "error"),
    [(500, TransientError), (503, TransientError), (429, TransientError), (408, TransientError),
     (404, PermanentError), (400, PermanentError), (410, PermanentError), (301, PermanentError),
     (302, PermanentError)],
)  # fmt: skip
def test_webhook_response_classes(server, allow_loopback, tenant_a, status, error):
    with pytest.raises(error):
        webhook_send(ctx=_ctx({"url": _url(server, f"/status/{status}")}))
    # Redirects are not followed: the server saw exactly the one request.
    assert [r["path"] for r in server.requests] == [f"/status/{status}"]


# --- Retry-After -------------------------------------------------------------------------


def _retry_row_after_answer(server, tenant, retry_after: str, status: int = 429):
    """Run a webhook occurrence whose target answers `status` with `retry_after`; returns
    the occurrence, its retry-lane outbox row and the instants just before and after."""
    path = f"/status/{status}?retry-after={quote(retry_after)}"
    open_ports(tenant, server.server_port)
    sched = schedule(tenant, handler="webhook", payload={"url": _url(server, path)})
    occ = occurrence(sched, timezone.now())
    before = timezone.now()
    summary = occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for,
                                 worker_id="w")  # fmt: skip
    after = timezone.now()
    assert summary == {"status": "RETRY_WAIT", "attempt_no": 1}
    row = DispatchOutbox.objects.get(occurrence_id=occ.id)
    assert row.lane == Lane.RETRY
    return occ, row, before, after


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_seconds_hold_the_retry_back_at_least_that_long(
    server, allow_loopback, tenant_a, settings, status
):
    settings.TICK_RETRY_BASE_S = 2  # the usual backoff alone would retry within 2 s

    _, row, before, after = _retry_row_after_answer(server, tenant_a, "30", status)

    assert before + timedelta(seconds=30) <= row.available_at <= after + timedelta(seconds=30)


def test_retry_after_http_date_holds_the_retry_back_until_that_instant(
    server, allow_loopback, tenant_a
):
    asked = (timezone.now() + timedelta(seconds=90)).replace(microsecond=0)

    _, row, _, after = _retry_row_after_answer(
        server, tenant_a, format_datetime(asked, usegmt=True)
    )

    assert asked <= row.available_at <= after + timedelta(seconds=90)


@pytest.mark.parametrize("header", ["soon", "-30", "3.5", "Someday, 99 Foo 2026"])
def test_malformed_retry_after_leaves_the_usual_backoff(
    server, allow_loopback, tenant_a, settings, header
):
    settings.TICK_RETRY_BASE_S = 2  # first retry: full jitter within [0, 2] s

    _, row, before, after = _retry_row_after_answer(server, tenant_a, header)

    assert before <= row.available_at <= after + timedelta(seconds=2)


def test_retry_after_past_the_retry_deadline_is_capped_at_the_deadline(
    server, allow_loopback, tenant_a, settings
):
    settings.TICK_RETRY_DEADLINE_S = 600

    occ, row, _, _ = _retry_row_after_answer(server, tenant_a, "9" * 40)

    deadline = retry_deadline(scheduled_for=occ.scheduled_for, deadline_at=None)
    assert row.available_at == deadline
    assert state_of(occ) == Occurrence.State.RETRY_WAIT


def test_retry_after_is_read_only_from_429_and_503(server, allow_loopback, tenant_a):
    for status, expected in [(429, 30.0), (503, 30.0), (500, None), (408, None)]:
        url = _url(server, f"/status/{status}?retry-after=30")
        with pytest.raises(TransientError) as excinfo:
            webhook_send(ctx=_ctx({"url": url}))
        assert excinfo.value.retry_after_s == expected, status


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("30", 30.0), (" 0 ", 0.0), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0), (None, None),
     ("", None), ("1e3", None), ("\uff11\uff12", None), ("Fri, 31 Dec 99999 23:59:59 GMT", None),
     ("9" * 5000, 86_400.0), ("Fri, 31 Dec 9999 23:59:59 GMT", 86_400.0)],
)  # fmt: skip
def test_retry_after_header_forms(header, seconds, settings):
    settings.TICK_RETRY_DEADLINE_S = 86_400
    assert retry_after_s(header) == seconds


def test_webhook_read_timeout_is_transient(server, allow_loopback, settings, tenant_a):
    settings.TICK_WEBHOOK_READ_TIMEOUT_S = 0.3
    started = time.monotonic()
    with pytest.raises(TransientError, match="timed out"):
        webhook_send(ctx=_ctx({"url": _url(server, "/sleep")}))
    assert time.monotonic() - started < 1.2


def test_webhook_connection_refused_is_transient(allow_loopback, hook_tenant):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    open_ports(hook_tenant, port)
    with pytest.raises(TransientError):
        webhook_send(ctx=_ctx({"url": f"http://127.0.0.1:{port}/"}))


def test_allowlisted_host_name_may_be_called(server, settings, tenant_a):
    settings.TICK_WEBHOOK_ALLOWLIST = ["localhost"]
    ctx = _ctx({"url": f"http://localhost:{server.server_port}/by-name"})
    try:
        webhook_send(ctx=ctx)
    except TransientError:  # localhost may resolve to ::1 first, where nothing listens
        pytest.skip("localhost resolved to an address the test server does not listen on")
    assert server.requests[0]["headers"]["Host"] == f"localhost:{server.server_port}"


# --- the SSRF guard ---------------------------------------------------------------------

SSRF_VECTORS = [
    "http://127.0.0.1:{port}/", "http://localhost:{port}/", "http://2130706433:{port}/",
    "http://0x7f.1:{port}/", "http://0177.0.0.1:{port}/", "http://127.1:{port}/",
    "http://0x7f000001:{port}/", "http://017700000001:{port}/", "http://127.0.0.01:{port}/",
    "http://[::1]:{port}/", "http://[::ffff:127.0.0.1]:{port}/", "http://[::ffff:7f00:1]:{port}/",
    "http://[::127.0.0.1]:{port}/", "http://[64:ff9b::7f00:1]:{port}/",
    "http://[2002:7f00:1::]:{port}/", "http://[0:0:0:0:0:ffff:127.0.0.1]:{port}/",
    "http://10.0.0.1/", "http://172.16.5.4/", "http://192.168.1.1/",
    "http://169.254.169.254/latest/meta-data/", "http://[::ffff:169.254.169.254]/",
    "http://[64:ff9b::a9fe:a9fe]/", "http://[2002:a9fe:a9fe::1]/", "http://100.64.0.1/",
    "http://100.127.255.254/", "http://224.0.0.1/", "http://239.255.255.250/", "http://0.0.0.0/",
    "http://0/", "http://[::]/", "http://255.255.255.255/", "http://240.0.0.1/",
    "http://198.18.0.1/", "http://192.0.2.1/", "http://[fe80::1]/", "http://[fe80::1%25eth0]/",
    "http://[fc00::1]/", "http://[fd12:3456::1]/", "http://[ff02::1]/",
    "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", "http://[64:ff9b:1::a00:1]/",
    "ftp://example.com/", "file:///etc/passwd", "gopher://127.0.0.1:{port}/_x",
    "javascript:alert(1)", "http://user:pw@example.com/", "http:///no-host",
    "http://example.com:99999/", "http://exa mple.com/",
]  # fmt: skip


@pytest.mark.parametrize("template", SSRF_VECTORS)
def test_every_ssrf_vector_is_refused_and_nothing_is_sent(server, settings, template):
    settings.TICK_WEBHOOK_ALLOWLIST = []
    url = template.format(port=server.server_port)

    with pytest.raises(PermanentError):
        webhook_send(ctx=_ctx({"url": url}))

    assert server.requests == []


def test_name_resolving_to_any_private_address_is_refused(monkeypatch, settings):
    # A DNS answer mixing a public and a private address (rebinding setups): refused whole.
    settings.TICK_WEBHOOK_ALLOWLIST = []
    answers = [("93.184.215.14", 80), ("10.1.2.3", 80)]

    def fake_getaddrinfo(host, port, *args, **kwargs):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", a) for a in answers]

    monkeypatch.setattr("apps.occurrences.execution.ssrf.socket.getaddrinfo", fake_getaddrinfo)

    with pytest.raises(PermanentError, match="10.1.2.3"):
        webhook_send(ctx=_ctx({"url": "http://rebind.example/"}))


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "2002:808:808::1", "64:ff9b::808:808"]
)
def test_public_addresses_pass(address):
    assert address_refusal(ipaddress.ip_address(address), Allowlist()) is None


def test_check_url_parses_what_it_accepts():
    target = check_url("HTTPS://Example.COM./a/b?c=d", allowlist=Allowlist())
    assert (target.scheme, target.host, target.port, target.request_path, target.host_header) == (
        "https", "example.com", 443, "/a/b?c=d", "example.com",
    )  # fmt: skip
    with pytest.raises(SSRFRefused):
        check_url("http://10.0.0.1/", allowlist=Allowlist())
    assert check_url("http://10.0.0.1/", allowlist=Allowlist.parse(["10.0.0.0/8"])).port == 80


# --- create-time validation ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ("https://example.com", "payload"),
        ({}, "url"),
        ({"url": "http://127.0.0.1/"}, "url"),
        ({"url": "http://2130706433/"}, "url"),
        ({"url": "https://example.com/", "headers": {"Idempotency-Key": "x"}}, "headers"),
        ({"url": "https://example.com/", "headers": {"X-A": 1}}, "headers"),
        ({"url": "https://example.com/", "headers": {"X-A": "a\r\nB: c"}}, "headers"),
        ({"url": "https://example.com/", "extra": 1}, "payload"),
        ({"url": "https://example.com/", "body": "x" * 300_000}, "body"),
    ],
)
def test_validate_webhook_payload_names_the_bad_field(payload, field, settings):
    settings.TICK_WEBHOOK_ALLOWLIST = []
    with pytest.raises(WebhookPayloadError) as excinfo:
        validate_webhook_payload(payload)
    assert excinfo.value.field == field


def test_valid_webhook_payload_passes_and_the_handler_is_registered():
    validate_webhook_payload(
        {"url": "https://example.com/hook", "body": [1], "headers": {"A": "b"}}
    )
    assert handler_spec("webhook") is not None and handler_spec("noop") is not None


# --- headers: validated at create/update/preview and again at send ------------------------


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({"X A": "1"}, "not a valid header name"),
        ({"X:A": "1"}, "not a valid header name"),
        ({"": "1"}, "not a valid header name"),
        ({"X-Ünï": "1"}, "not a valid header name"),
        ({"X-A\r\nB": "1"}, "not a valid header name"),
        ({"x" * 129: "1"}, "at most 128 characters"),
        ({"Host": "evil.example"}, "reserved"),
        ({"HOST": "evil.example"}, "reserved"),
        ({"Content-Length": "0"}, "reserved"),
        ({"transfer-encoding": "chunked"}, "reserved"),
        ({"Connection": "close"}, "reserved"),
        ({"Keep-Alive": "timeout=5"}, "reserved"),
        ({"TE": "trailers"}, "reserved"),
        ({"Trailer": "X"}, "reserved"),
        ({"Upgrade": "h2c"}, "reserved"),
        ({"Proxy-Connection": "x"}, "reserved"),
        ({"Proxy-Authorization": "Basic eA=="}, "reserved"),
        ({"Expect": "100-continue"}, "reserved"),
        ({"X-A": "1", "x-a": "2"}, "given twice"),
        ({"X-A": 1}, "must be a string"),
        ({"X-A": None}, "must be a string"),
        ({"X-A": "a\r\nInjected: 1"}, "control character"),
        ({"X-A": "a\nb"}, "control character"),
        ({"X-A": "a\x00b"}, "control character"),
        ({"X-A": "a\x7fb"}, "control character"),
        ({"X-A": "snow ☃"}, "outside Latin-1"),
        ({"X-A": "v" * 4097}, "longer than 4096"),
        ({f"X-{n}": "v" * 1000 for n in range(17)}, "exceed 16384"),
        ({f"X-{n}": "v" for n in range(21)}, "at most 20 headers"),
        (["X-A", "1"], "must be an object"),
    ],
)  # fmt: skip
def test_bad_headers_are_refused_on_the_headers_field(headers, says):
    payload = {"url": "https://example.com/hook", "headers": headers}

    with pytest.raises(WebhookPayloadError, match=says) as excinfo:
        validate_webhook_payload(payload)

    assert excinfo.value.field == "headers"


def test_latin1_values_and_tabs_pass_and_arrive_as_sent(server, allow_loopback):
    headers = {"X-Name": "café\tcrème", "X-Token_1.~!#$%&'*+^`|": "ok"}
    validate_webhook_payload({"url": "https://example.com/", "headers": headers})

    assert webhook_send(ctx=_ctx({"url": _url(server), "headers": headers})) == 200

    [request] = server.requests
    assert request["headers"]["X-Name"] == "café\tcrème"


# --- ports ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "extra", "port"),
    [("https://example.com/", (), 443), ("http://example.com/", (), 80),
     ("http://example.com:443/", (), 443), ("https://example.com:80/", (), 80),
     ("https://example.com:6379/", (6379,), 6379), ("http://example.com:8080/", (8080, 9), 8080)],
)  # fmt: skip
def test_ports_80_443_and_the_tenants_own_pass(url, extra, port):
    assert check_url(url, allowlist=Allowlist(), extra_ports=extra).port == port


@pytest.mark.parametrize(
    ("url", "extra"),
    [("https://example.com:6379/", ()), ("http://example.com:8080/", (8081,)),
     ("http://example.com:0/", ()), ("https://example.com:22/", (6379,)),
     ("http://8.8.8.8:5432/", ())],
)  # fmt: skip
def test_other_ports_are_refused(url, extra):
    with pytest.raises(SSRFRefused, match="port"):
        check_url(url, allowlist=Allowlist(), extra_ports=extra)


def test_the_operator_allowlist_does_not_open_ports(settings):
    # The operator allowlist is about addresses; a port is the tenant's to open.
    settings.TICK_WEBHOOK_ALLOWLIST = ["10.0.0.0/8", "internal.example"]
    for url in ("http://10.0.0.1:6379/", "http://internal.example:6379/"):
        with pytest.raises(WebhookPayloadError, match="port 6379"):
            validate_webhook_payload({"url": url})


def test_a_tenants_ports_open_only_its_own_webhooks(tenant_a, tenant_b):
    open_ports(tenant_a, 6379)
    payload = {"url": "https://example.com:6379/"}

    validate_webhook_payload(payload, tenant=tenant_a)
    with pytest.raises(WebhookPayloadError, match="port 6379"):
        validate_webhook_payload(payload, tenant=tenant_b)
    with pytest.raises(WebhookPayloadError, match="port 6379"):
        validate_webhook_payload(payload)


# --- URLs the parser cannot take apart -----------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["http://[::1/", "http://[abc]/", "http://[::1]x/", "http://example.com:99999999/",
     "http://example.com:-1/", "http://example.com:8o/", "http://" + "a" * 64 + ".com/",
     "http://exa\u0000mple.com/", "http://exa\u007fmple.com/", "http://[v1.x]/", "http://:80/"],
)  # fmt: skip
def test_malformed_urls_are_refused_on_the_url_field(url):
    with pytest.raises(WebhookPayloadError) as excinfo:
        validate_webhook_payload({"url": url})

    assert excinfo.value.field == "url"


def test_unicode_host_and_path_are_sent_in_their_ascii_forms():
    target = check_url("https://bücher.example/grüße?q=ü", allowlist=Allowlist())

    assert target.host == "xn--bcher-kva.example"
    assert target.host_header == "xn--bcher-kva.example"
    assert target.request_path == "/gr%C3%BC%C3%9Fe?q=%C3%BC"


# --- at send time a configuration error is permanent: DEAD at once, with the reason --------


@pytest.mark.parametrize(
    ("payload", "reason"),
    [({"headers": {"Host": "evil.example"}}, "reserved"),
     ({"headers": {"X-A": "a\r\nInjected: 1"}}, "control character"),
     ({"headers": {"Bad Name": "1"}}, "not a valid header name"),
     ({"url": "http://[::1/"}, "malformed"),
     ({"url": "http://[abc]/"}, "malformed")],
)  # fmt: skip
def test_a_stored_misconfiguration_goes_dead_at_once_without_a_request(
    server, allow_loopback, tenant_a, payload, reason
):
    # given: a schedule stored before these rules (the service does not validate payloads)
    open_ports(tenant_a, server.server_port)
    sched = schedule(tenant_a, handler="webhook", payload={"url": _url(server), **payload})
    occ = occurrence(sched, timezone.now())

    # when: the worker runs it
    summary = occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for,
                                 worker_id="w")  # fmt: skip

    # then: DEAD on the first attempt, no retry row, nothing sent, the reason recorded
    assert summary == {"status": "DEAD", "attempt_no": 1}
    assert state_of(occ) == Occurrence.State.DEAD
    assert not DispatchOutbox.objects.filter(occurrence_id=occ.id).exists()
    assert server.requests == []
    [attempt] = Attempt.objects.filter(occurrence_id=occ.id)
    assert attempt.outcome == Attempt.Outcome.FAILED
    assert attempt.error_class == "WebhookPayloadError"
    assert reason in attempt.error_message


def test_a_port_closed_after_create_goes_dead_at_send(server, allow_loopback, tenant_a):
    # given: a webhook created while the tenant allowed the server's port
    open_ports(tenant_a, server.server_port)
    sched = schedule(tenant_a, handler="webhook", payload={"url": _url(server)})
    validate_webhook_payload(sched.payload, tenant=tenant_a)
    occ = occurrence(sched, timezone.now())
    # when: an operator closes the port again, then the occurrence runs
    tenant_a.webhook_allowed_ports = []
    tenant_a.save(update_fields=["webhook_allowed_ports"])
    summary = occurrence_execute(occurrence_id=occ.id, scheduled_for=occ.scheduled_for,
                                 worker_id="w")  # fmt: skip

    # then
    assert summary == {"status": "DEAD", "attempt_no": 1}
    assert server.requests == []
    [attempt] = Attempt.objects.filter(occurrence_id=occ.id)
    assert f"port {server.server_port} is not allowed" in attempt.error_message
