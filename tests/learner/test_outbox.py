"""The learner trains on through a site outage: reports queue in order and the newest publication waits,
and all of it reaches the site once it answers again. A real HTTP server on loopback goes down and comes
back on the same port; a refusal (4xx) is still raised."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from echo2_site.demo import free_port
from learner.client import SiteClient, SiteError, SiteUnreachable
from learner.outbox import Outbox, Publication


class FakeSite:
    """A stand-in for the site's learner endpoints: records every POST, refuses step 99 with a 400."""

    def __init__(self) -> None:
        self.port, self.received, self.server = free_port(), [], None

    def start(self) -> FakeSite:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                refused = body.get("step") == 99
                if not refused:
                    site.received.append((self.path, body))
                self.send_response(400 if refused else 201)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps({"detail": "step: refused"} if refused else {"n_chains": 2}).encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def site():
    fake = FakeSite().start()
    yield fake
    fake.stop()


def test_reports_queue_through_an_outage_and_arrive_in_order(site) -> None:
    client = SiteClient(f"http://127.0.0.1:{site.port}", "token", timeout=2, retries=1)
    published = []
    outbox = Outbox(client, 7, on_published=lambda pub, reply: published.append((pub.version, reply["n_chains"])))
    outbox.report({"step": 1})
    site.stop()  # the site goes down
    outbox.report({"step": 2})
    outbox.publish(Publication(2, "http://l/v2/", {"total_bytes": 1}))
    outbox.report({"step": 3})
    outbox.publish(Publication(4, "http://l/v4/", {"total_bytes": 1}))  # supersedes v2, never announced
    outbox.report({"step": 4})
    assert outbox.down_since is not None and outbox.pending == 4
    site.start()  # back on the same port
    assert outbox.flush()
    paths = [(path, body.get("step", body.get("version"))) for path, body in site.received]
    assert paths == [("/api/jobs/7/metrics/", 1), ("/api/jobs/7/snapshots/", 4), ("/api/jobs/7/metrics/", 2),
                     ("/api/jobs/7/metrics/", 3), ("/api/jobs/7/metrics/", 4)]
    assert published == [(4, 2)] and outbox.pending == 0 and outbox.down_since is None
    client.close()


def test_a_refusal_is_not_an_outage(site) -> None:
    client = SiteClient(f"http://127.0.0.1:{site.port}", "token", timeout=2, retries=0)
    outbox = Outbox(client, 7, on_published=lambda pub, reply: None)
    with pytest.raises(SiteError, match="400 step: refused") as err:
        outbox.report({"step": 99})
    assert not isinstance(err.value, SiteUnreachable)
    client.close()


def test_drain_gives_up_after_its_budget(site) -> None:
    client = SiteClient(f"http://127.0.0.1:{site.port}", "token", timeout=1, retries=0)
    outbox = Outbox(client, 7, on_published=lambda pub, reply: None)
    site.stop()
    outbox.report({"step": 1})
    assert not outbox.drain(within_s=0.5, pause_s=0.1)
    site.start()
    assert outbox.drain(within_s=5, pause_s=0.1) and [b["step"] for _, b in site.received] == [1]
    client.close()


def test_a_throttled_request_waits_as_told_and_is_sent_again() -> None:
    """The site answers 429 with Retry-After when the learner exceeds its request rate: not a refusal."""
    import httpx

    calls: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(time.monotonic())
        if len(calls) < 3:
            return httpx.Response(429, headers={"Retry-After": "0.2"}, json={"detail": "Request was throttled."})
        return httpx.Response(201, json={"step": 1})

    client = SiteClient("http://site", "e2u_t")
    client.http = httpx.Client(base_url="http://site/api/", transport=httpx.MockTransport(handler))
    assert client.report(1, {"step": 1, "reward_mean": 0.0}) == {"step": 1}
    assert len(calls) == 3 and calls[2] - calls[0] >= 0.35
    client.http = httpx.Client(base_url="http://site/api/", transport=httpx.MockTransport(
        lambda request: httpx.Response(429, headers={"Retry-After": "0"}, json={"detail": "Request was throttled."})))
    with pytest.raises(SiteError, match="429"):
        client.report(1, {"step": 1}, retries=2)
