"""The reference relay every wire-only run prints beside ours (issue 49): a naive pipelined relay with nothing of the
protocol. Threads, blocking sockets, 64 KiB reads, each read handed at once to the child's sender, no framing, no
hashing on the path, no credentials, no token buckets, the kernel's default socket buffers. Only the bench uses it: it
shows what a plain chain gets from the same namespaces, tbf links and delay proxies in the same run, so ours/naive
is the cost of our relay's code, not of the links.

Run as ``python -m bench.wan.naive origin --file PATH --listen HOST:PORT`` (serves the file whole to every connection)
or ``python -m bench.wan.naive relay --size BYTES --listen HOST:PORT`` (receives ``--size`` bytes from the parent it
is told, passing each read on to whoever connected to it). It speaks the harness's side of
:class:`dataplane.broadcast.driver.RelayProcess`: JSON-line events on stdout (``listening``; ``installed`` with
``t``, the wall time of the last byte, and the payload's ``sha256``, computed after the last byte went on to the
child), commands on stdin (``parent`` with ``host`` and ``port``; ``exit``, or stdin's end).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import sys
import threading
import time

READ_BYTES = 64 * 1024


def emit(**event) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


class Buffer:
    """What has arrived so far; senders wait on it for more."""

    def __init__(self, size: int) -> None:
        self.data = bytearray(size)
        self.filled = 0
        self.size = size
        self.more = threading.Condition()

    def add(self, piece: bytes) -> None:
        with self.more:
            self.data[self.filled:self.filled + len(piece)] = piece
            self.filled += len(piece)
            self.more.notify_all()

    def send_all_to(self, conn: socket.socket) -> None:
        """Send every byte to ``conn`` as it arrives, then close it."""
        sent = 0
        view = memoryview(self.data)
        try:
            while sent < self.size:
                with self.more:
                    while self.filled == sent:
                        self.more.wait()
                    upto = self.filled
                conn.sendall(view[sent:upto])
                sent = upto
        finally:
            conn.close()


def serve(listener: socket.socket, buffer: Buffer, senders: list[threading.Thread]) -> None:
    """Accept children for ever, a sender thread each."""
    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        thread = threading.Thread(target=buffer.send_all_to, args=(conn,), daemon=True)
        senders.append(thread)
        thread.start()


def receive(host: str, port: int, buffer: Buffer, senders: list[threading.Thread]) -> None:
    """Read the parent's stream into the buffer (each read to the senders at once); report the install."""
    conn = socket.create_connection((host, port))
    while buffer.filled < buffer.size:
        piece = conn.recv(min(READ_BYTES, buffer.size - buffer.filled))
        if not piece:
            emit(event="error", reason=f"{host}:{port} closed after {buffer.filled} of {buffer.size} bytes")
            return
        buffer.add(piece)
    arrived = time.time()
    conn.close()
    for thread in list(senders):  # the hash off the path: after our child has every byte
        thread.join()
    emit(event="installed", t=arrived, sha256=hashlib.sha256(buffer.data).hexdigest(), stats={"from_fallback": 0})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wan.naive", description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=("origin", "relay"))
    parser.add_argument("--listen", required=True, help="HOST:PORT")
    parser.add_argument("--file", help="origin: the payload to serve")
    parser.add_argument("--size", type=int, help="relay: the payload's size in bytes")
    args = parser.parse_args(argv)
    if args.role == "origin":
        with open(args.file, "rb") as f:
            payload = f.read()
        buffer = Buffer(len(payload))
        buffer.add(payload)
    else:
        buffer = Buffer(args.size)
    host, _, port = args.listen.rpartition(":")
    listener = socket.create_server((host, int(port)), reuse_port=False)
    senders: list[threading.Thread] = []
    threading.Thread(target=serve, args=(listener, buffer, senders), daemon=True).start()
    emit(event="listening", port=int(port))
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("cmd") == "parent":
            threading.Thread(target=receive, args=(cmd["host"], int(cmd["port"]), buffer, senders),
                             daemon=True).start()
        elif cmd.get("cmd") == "exit":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
