"""A private redis-server on a free port that a test may kill and restart (never the machine's own Redis).

Started with AOF (``appendfsync everysec``) in the test's own directory, stopped by process id."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from echo2_site.demo import free_port


class PrivateRedis:
    def __init__(self, directory: Path, *, aof: bool = True) -> None:
        self.directory, self.aof, self.port = directory, aof, free_port()
        self.process: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", str(self.directory),
             "--appendonly", "yes" if self.aof else "no", "--appendfsync", "everysec"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown save, what a crash or an OOM kill does."""
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.process = None
