"""Static files as daphne serves them (the ASGI application, not the test client, which skips the static handler):
a path climbing out of a static folder is a 400, not the unhandled SuspiciousFileOperation of issue 26."""

from __future__ import annotations

import pytest
from channels.testing import HttpCommunicator

from echo2_site.asgi import application


async def _status(path: str) -> int:
    communicator = HttpCommunicator(application, "GET", path)
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(timeout=10)
    await communicator.wait(timeout=10)
    return start["status"]


@pytest.mark.parametrize("path", ["/static/%2e%2e/manage.py", "/static/../manage.py",
                                  "/static/%2e%2e/%2e%2e/etc/passwd"])
async def test_a_path_out_of_the_static_folders_is_a_400(path):
    assert await _status(path) == 400


async def test_static_files_are_still_served():
    assert await _status("/static/admin/css/base.css") == 200
    assert await _status("/static/no-such-file.css") == 404
