"""A hostile HTTP receiver: it answers `HTTP/1.1 200 OK` at once, then one header byte every
`drip_s` seconds, for ever: each read sees a byte well within any read timeout. It records
when each connection was accepted and when the caller closed it, so a test can tell how long
each call held its connection and whether two were open at once."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class SlowLoris:
    port: int
    connections: list[float] = field(default_factory=list)  # monotonic accept times
    closed_at: dict[int, float] = field(default_factory=dict)  # connection index: close time
    closed: threading.Event = field(default_factory=threading.Event)

    def spans(self) -> list[tuple[float, float | None]]:
        """(accepted, closed or None while open) per connection, in accept order."""
        return [(at, self.closed_at.get(n)) for n, at in enumerate(self.connections)]


@contextmanager
def slow_loris(drip_s: float = 0.3) -> Iterator[SlowLoris]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    server = SlowLoris(port=listener.getsockname()[1])
    stop = threading.Event()
    drips: list[threading.Thread] = []

    def caller_gone(n: int) -> None:
        server.closed_at.setdefault(n, time.monotonic())
        server.closed.set()

    def drip(conn: socket.socket, n: int) -> None:
        with conn:
            try:
                conn.recv(65536)  # the request
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                while True:
                    # Readable with nothing to read: the caller shut the connection down.
                    readable, _, _ = select.select([conn], [], [], drip_s)
                    if readable and not conn.recv(65536):
                        caller_gone(n)
                        return
                    if stop.is_set():
                        return
                    conn.sendall(b"X")
            except OSError:  # the caller gave up and closed: what the test wants
                caller_gone(n)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            server.connections.append(time.monotonic())
            n = len(server.connections) - 1
            drips.append(threading.Thread(target=drip, args=(conn, n), daemon=True))
            drips[-1].start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join()
        for dripping in drips:  # each notes a close it has seen before it ends
            dripping.join(drip_s + 1)
        listener.close()
