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


def test_started_the_outbox_sends_from_its_own_thread_in_order_and_raises_a_refusal_later(site) -> None:
    """The training thread only queues: sending happens on the outbox's thread, through an outage too."""
    client = SiteClient(f"http://127.0.0.1:{site.port}", "token", timeout=2, retries=0)
    outbox = Outbox(client, 7, on_published=lambda pub, reply: None).start()
    site.stop()
    started = time.monotonic()
    for step in range(1, 6):
        outbox.report({"step": step})  # the site is down: none of these waits for it
    assert time.monotonic() - started < 1.0
    site.start()
    deadline = time.monotonic() + 10
    while outbox.pending and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [body["step"] for _, body in site.received] == [1, 2, 3, 4, 5]
    outbox.report({"step": 99})  # refused by the site, on the sender's thread
    deadline = time.monotonic() + 10
    while outbox.refusal is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(SiteError, match="step: refused"):
        outbox.report({"step": 6})  # the training thread hears of it at its next call
    assert outbox.drain(within_s=5)
    assert [body["step"] for _, body in site.received] == [1, 2, 3, 4, 5]  # 6 was not queued: the call raised
    client.close()


def test_t_train_is_announced_from_the_outbox_thread_through_an_outage_newest_first(site) -> None:
    """T_train (every tenth step) no longer holds the training thread for a round trip: queued like a report, the
    newest value replacing one not yet sent, and sent before the reports once the site answers."""
    client = SiteClient(f"http://127.0.0.1:{site.port}", "token", timeout=2, retries=0)
    outbox = Outbox(client, 7, on_published=lambda pub, reply: None).start()
    site.stop()
    started = time.monotonic()
    outbox.announce(0.5)
    outbox.report({"step": 10})
    outbox.announce(0.25)  # replaces 0.5 if that one was not sent yet
    assert time.monotonic() - started < 1.0
    site.start()
    deadline = time.monotonic() + 10
    while outbox.pending and time.monotonic() < deadline:
        time.sleep(0.05)
    learner = [body["t_train"] for path, body in site.received if path == "/api/jobs/7/learner/"]
    assert learner[-1] == 0.25 and set(learner) <= {0.5, 0.25}
    assert [body["step"] for path, body in site.received if path.endswith("/metrics/")] == [10]
    outbox.stop()
    client.close()


def test_deltas_queue_behind_their_base_and_a_full_snapshot_replaces_them(site) -> None:
    client = SiteClient(f"http://127.0.0.1:{site.port}", "token", timeout=2, retries=1)
    outbox = Outbox(client, 7, on_published=lambda pub, reply: None)
    site.stop()

    def delta(version: int) -> Publication:
        return Publication(version, f"http://l/v{version}/", {"kind": "delta", "base_version": version - 1})

    outbox.publish(Publication(10, "http://l/v10/", {"kind": "full"}))
    for version in (11, 12):  # each applies only on top of the one before: none may be skipped
        outbox.publish(delta(version))
    assert outbox.pending_versions() == {10, 11, 12}
    outbox.publish(Publication(20, "http://l/v20/", {"kind": "full"}))  # needs nothing before it
    outbox.publish(delta(21))
    assert outbox.pending_versions() == {20, 21}
    site.start()
    assert outbox.flush()
    assert [body["version"] for _, body in site.received] == [20, 21] and outbox.pending_versions() == set()
    client.close()


def test_a_newer_full_snapshot_never_replaces_the_base(site) -> None:
    """Published while the site is down (at a learner's start, or its restart moving the base to its new address),
    the base still reaches the site before what followed it: every agent that joins later starts from it."""
    client = SiteClient(f"http://127.0.0.1:{site.port}", "token", timeout=2, retries=1)
    outbox = Outbox(client, 7, on_published=lambda pub, reply: None)
    site.stop()
    outbox.publish(Publication(0, "http://l/v0/", {"kind": "full", "format": "checkpoint-tar"}))
    outbox.publish(Publication(2, "http://l/v2/", {"kind": "full"}))
    outbox.publish(Publication(4, "http://l/v4/", {"kind": "full"}))
    assert outbox.pending_versions() == {0, 4}
    site.start()
    assert outbox.flush()
    assert [body["version"] for _, body in site.received] == [0, 4] and outbox.pending_versions() == set()
    client.close()
