"""Servers that lie about sizes, for the bounds tests: each counts what it managed to send, so a test shows
that its reader stopped early (a reader that took everything makes the sender's count the whole lie)."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PIECE = bytes(64 << 10)


class LyingHTTPServer:
    """Answers every GET with ``body_bytes`` zero bytes (``Content-Length`` saying so when ``declare``, else a body
    delimited by closing the connection), or with ``status`` and a ``Location`` when ``redirect_to`` is set."""

    def __init__(self, body_bytes: int, *, declare: bool = True, redirect_to: str | None = None) -> None:
        self.sent = 0
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.hits += 1
                if redirect_to:
                    self.send_response(302)
                    self.send_header("Location", redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                if declare:
                    self.send_header("Content-Length", str(body_bytes))
                else:
                    self.close_connection = True
                self.end_headers()
                left = body_bytes
                try:
                    while left > 0:
                        piece = PIECE[:left]
                        self.wfile.write(piece)
                        outer.sent += len(piece)
                        left -= len(piece)
                except OSError:
                    return  # the reader hung up: what we want

            def log_message(self, *args: object) -> None:
                pass

        Handler.protocol_version = "HTTP/1.1" if declare else "HTTP/1.0"
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, path: str = "/v2/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> LyingHTTPServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class RawServer:
    """A TCP service that is not HTTP: writes ``greeting`` to each connection (nothing: a silent one), then waits
    for the peer to hang up."""

    def __init__(self, greeting: bytes = b"") -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.greeting = greeting
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._open: list[socket.socket] = []

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._open.append(conn)
            if self.greeting:
                conn.sendall(self.greeting)

    def __enter__(self) -> RawServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
        for conn in self._open:
            conn.close()


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return sock.getsockname()[1]
