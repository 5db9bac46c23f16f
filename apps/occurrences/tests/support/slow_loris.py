"""A hostile HTTP receiver: it answers `HTTP/1.1 200 OK` at once, then one header byte every
`drip_s` seconds, for ever: each read sees a byte well within any read timeout."""

from __future__ import annotations

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
    closed: threading.Event = field(default_factory=threading.Event)


@contextmanager
def slow_loris(drip_s: float = 0.3) -> Iterator[SlowLoris]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    server = SlowLoris(port=listener.getsockname()[1])
    stop = threading.Event()

    def drip(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)  # the request
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                while not stop.wait(drip_s):
                    conn.sendall(b"X")
            except OSError:  # the caller gave up and closed: what the test wants
                server.closed.set()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            server.connections.append(time.monotonic())
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join()
        listener.close()
