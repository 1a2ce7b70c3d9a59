"""The agent's connection to its site: one websocket, reconnected with jittered back-off, and requests that are
never dropped by the transport.

- **Requests by id.** Every request (a lease request, a batch of groups) goes under a fresh id; its reply names
  it (``ref_id``) and is paired by id, never by order. A reply that comes after its request was given up on is
  discarded.
- **Paced.** Every frame waits for the budget the site announced (:mod:`worker_agent.pacing`), so an honest agent
  is not refused.
- **Resent, not dropped.** A refusal that is the transport's (``rejected`` with ``retry_after``: over budget) holds
  every send that long, then the same request goes again under the same id; a request whose connection was lost
  goes again once the agent is back (after its ``welcome``); a reply that never comes sends it again. All within
  the request's ``deadline``. Only the site's verdict on the content ends a request otherwise; the site answers a
  resend with the verdict it gave the first sending (``marketplace/infra/verdicts.py``), and a group it stored
  already is told accepted again, never stored or trained twice. Ids carry a random prefix per agent process, so a
  restarted agent's requests are never taken for its predecessor's.
- **Watched.** A site that stops answering is noticed by the websocket's pings within ``PING_INTERVAL_S`` and the
  ping timeout, and the connection is made again.
- **Timed by what it measures** (:mod:`worker_agent.timing`): each reply's round trip and each ping's
  feed :attr:`SiteConnection.round_trips`; the reply timeout, the opening and the ping timeouts follow them
  between a floor and a ceiling, so a long or loaded path is not mistaken for a lost reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import websockets

from dataplane import messages as m

from . import submit
from .pacing import Pacer
from .timing import RoundTrips

log = logging.getLogger("echo2.agent")

MAX_REPLY_BACKOFF = 8.0  # a request's reply timeout grows to this multiple at most while its replies do not come
PING_INTERVAL_S = 5.0  # the ping timeout follows the measured round trips (timing.RoundTrips.ping_timeout)
Reply = m.Lease | m.NoWork | m.Accepted | m.Rejected | m.Submitted


class AgentRejected(RuntimeError):
    """The site refused this agent (unknown key): retrying cannot help."""


class NotConnected(ConnectionError):
    """No connection to the site now."""


def websocket_url(server: str) -> str:
    parts = urlsplit(server)
    scheme = {"https": "wss", "http": "ws"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + "/ws/agent/", "", ""))


def reconnect_delays(*, first: float = 1.0, cap: float = 30.0,
                     clock: Callable[[], float] | None = None) -> Iterator[float]:
    """Waits before each reconnection attempt: a random quarter to half of the time spent away so far (at least
    ``first``); past ``2 cap`` away, a random half to all of ``cap`` (jittered at the cap too: a fixed wait would
    keep a fleet's attempts in whatever step they fell into). Proportional waits bring the agent back within half
    the outage again after the site returns (doubling waits: up to as long again), and the randomness spreads a
    fleet that lost the site together instead of bringing it back in step (tests/worker_agent/test_reconnect.py).
    ``clock`` (seconds, e.g. ``time.monotonic``): the time away is read from it, so the attempts themselves count
    (one that waits ``open_timeout`` on a dead link); without it, the sum of the waits."""
    start, away = (clock() if clock else 0.0), 0.0
    while True:
        if clock is not None:
            away = clock() - start
        wait = random.uniform(0.5, 1.0) * min(cap, 0.5 * max(first, away))
        if clock is None:
            away += wait
        yield wait


class SiteConnection:
    """The websocket, its pacing and the requests waiting on it. ``ws`` is None while disconnected."""

    def __init__(self, server: str, agent_key: str, *, max_reconnect_delay: float = 30.0) -> None:
        self.url = websocket_url(server)
        self.agent_key = agent_key
        self.max_reconnect_delay = max_reconnect_delay
        self.ws = None
        self.pacer = Pacer()
        self.max_message_bytes = submit.DEFAULT_MAX_MESSAGE_BYTES  # the site's frame limit, once its welcome says
        self.welcomed = asyncio.Event()  # a socket is open and the site's welcome (its budget) arrived
        self.waiting: dict[str, asyncio.Future] = {}  # request id -> its reply, once the site answers
        # Requests whose sender stopped waiting because its work stopped (a release cancels the rollout loop): their
        # replies may still come, and are expected, not news.
        self.abandoned: deque[str] = deque(maxlen=256)
        self.request_lock = asyncio.Lock()  # held while one request's frames go out (parts never interleave)
        self.refused = 0  # our frames the site refused for the transport's sake (each sent again)
        self.resent = 0  # requests sent again (refused, connection lost, no reply)
        self.round_trips = RoundTrips()  # replies' and pings' round trips: the timeouts follow them
        self._pinged = 0.0  # the websocket's last ping latency sampled
        self._ids = itertools.count(1)
        # The site keeps each request's verdict by (worker, id) for a while and answers a resend with it: a restarted
        # agent, counting from 1 again, must not be answered with its predecessor's verdicts.
        self._id_prefix = secrets.token_hex(4)

    # ---- the socket -------------------------------------------------------------------------

    async def run(self, session: Callable[[], Awaitable[None]], stopped: asyncio.Event) -> None:
        """Connect, run ``session`` while connected (it reads the socket), and connect again when it ends, until
        ``stopped``; :class:`AgentRejected` ends it for good."""
        delays = reconnect_delays(cap=self.max_reconnect_delay, clock=time.monotonic)
        while not stopped.is_set():
            connected = False
            try:
                headers = {"Authorization": f"Bearer {self.agent_key}"}
                rtt = self.round_trips
                async with websockets.connect(self.url, additional_headers=headers, open_timeout=rtt.open_timeout(),
                                              ping_interval=PING_INTERVAL_S, ping_timeout=rtt.ping_timeout(),
                                              max_size=64 * 2**20) as ws:
                    log.info("connected to %s", self.url)
                    connected = True
                    self.attach(ws)
                    try:
                        await session()
                    finally:
                        self.detach()
                why = "the site closed the connection"
            except AgentRejected:
                raise
            except (OSError, TimeoutError, websockets.WebSocketException) as err:
                reason = err or type(err).__name__
                why = (f"connection to {self.url} lost ({reason})" if connected
                       else f"cannot reach {self.url} ({reason})")
            if stopped.is_set():
                break
            if connected:  # the time away counts from this loss
                delays = reconnect_delays(cap=self.max_reconnect_delay, clock=time.monotonic)
            delay = next(delays)
            log.warning("%s; reconnecting in %.1f s", why, delay)
            await asyncio.sleep(delay)

    def attach(self, ws) -> None:
        """A new socket: a fresh budget (unknown until the welcome: only the hello goes before it)."""
        self.ws, self.pacer = ws, Pacer(share=self.pacer.share)
        self.welcomed.clear()

    def detach(self) -> None:
        """The socket is gone: the site will never answer what was asked on it (each request is sent again once
        the agent is back)."""
        self.ws = None
        self.welcomed.clear()
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(NotConnected("the connection was lost before the site answered"))

    def welcome(self, message: m.Welcome) -> None:
        self.max_message_bytes = message.max_message_bytes or submit.DEFAULT_MAX_MESSAGE_BYTES
        self.pacer.configure(messages_per_s=message.messages_per_s, message_burst=message.message_burst,
                             bytes_per_s=message.bytes_per_s, max_frame=self.max_message_bytes)
        self.welcomed.set()

    def sample_ping(self) -> None:
        """Take the websocket's newest ping round trip as a sample, once (called often: by the heartbeat loop)."""
        latency = getattr(self.ws, "latency", 0.0)
        if isinstance(latency, float) and latency > 0 and latency != self._pinged:
            self._pinged = latency
            self.round_trips.add(latency)

    # ---- sending ----------------------------------------------------------------------------

    async def send(self, message: m._Msg) -> None:
        """Send a message that expects no reply (paced); :class:`NotConnected` while disconnected."""
        await self.send_text(message.model_dump_json())

    async def send_text(self, text: str) -> None:
        if self.ws is None:
            raise NotConnected("not connected")
        ws = self.ws
        await self.pacer.wait(len(text.encode()) if not text.isascii() else len(text))
        if self.ws is not ws:
            raise NotConnected("the connection was lost while the frame waited for its budget")
        await ws.send(text)

    async def request(self, message: m.LeaseRequest | m.Trajectories | m.Submit, *, deadline_s: float) -> Reply:
        """Send a request under a fresh id and return the reply that names it, sending it again (same id) after a
        transport refusal's ``retry_after``, after a reconnect, or when no reply came within the reply timeout
        (:meth:`~worker_agent.timing.RoundTrips.reply_timeout`), until ``deadline_s`` has passed (then the last
        failure: :class:`TimeoutError` or :class:`NotConnected`). A group too big for the site's frame limit goes
        in parts (``submit.frames``), all under the one id; a record too big for any frame:
        :class:`submit.RecordTooBig`."""
        message = message.model_copy(update={"id": f"{self._id_prefix}-{next(self._ids)}"})
        deadline = time.monotonic() + deadline_s
        attempt = unanswered = 0
        while True:
            attempt += 1
            if attempt > 1:
                self.resent += 1
            try:
                # each reply that did not come doubles the next wait (RFC 6298 5.5): a site slower than our timeout
                # is not sent the same request again and again at that timeout
                reply = await self._exchange(message, deadline, timed=attempt == 1,
                                             backoff=min(2.0 ** unanswered, MAX_REPLY_BACKOFF))
            except TimeoutError as err:
                unanswered += 1
                if deadline - time.monotonic() <= 0:
                    raise
                log.info("request %s (%s): %s; sending it again", message.id, message.type, err)
                continue
            except NotConnected as err:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                log.info("request %s (%s): %s; sending it again once the site answers", message.id, message.type,
                         err or type(err).__name__)
                await self._until_welcomed(left)
                continue
            if isinstance(reply, m.Rejected) and reply.retry_after is not None:
                self.refused += 1
                self.pacer.hold(reply.retry_after)
                if time.monotonic() + reply.retry_after > deadline:
                    return reply
                log.warning("site refused our %s %s for now (%s); sending it again in %.2f s", message.type,
                            message.id, reply.reason, reply.retry_after)
                continue
            return reply

    async def _exchange(self, message, deadline: float, *, timed: bool = False, backoff: float = 1.0) -> Reply:
        """One attempt: the request's frames out, its reply back (or TimeoutError / NotConnected). ``timed``: its
        round trip, last frame out to reply in, is a sample (a first attempt: Karn's rule); ``backoff``: the reply
        timeout's multiple."""
        if self.ws is None or not self.welcomed.is_set():
            raise NotConnected("not connected")
        texts = submit.frames(message, limit=self.max_message_bytes)
        future = asyncio.get_running_loop().create_future()
        self.waiting[message.id] = future
        try:
            async with self.request_lock:
                for text in texts:
                    if future.done():  # a part refused: the rest would be refused too
                        break
                    try:
                        await self.send_text(text)
                    except websockets.WebSocketException as err:
                        raise NotConnected(str(err)) from None
            sent = time.monotonic()
            timeout = max(0.1, min(self.round_trips.reply_timeout() * backoff, deadline - sent))
            try:
                reply = await asyncio.wait_for(future, timeout)
                if timed:
                    self.round_trips.add(time.monotonic() - sent)
                return reply
            except TimeoutError:
                raise TimeoutError(f"no reply within {timeout:.0f} s") from None
        except asyncio.CancelledError:
            self.abandoned.append(message.id)
            raise
        finally:
            self.waiting.pop(message.id, None)

    async def _until_welcomed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.welcomed.wait(), timeout)

    def answer(self, reply: Reply) -> None:
        """A reply from the site: to the request it names, if that one still waits."""
        future = self.waiting.get(reply.ref_id)
        if future is None or future.done():
            if reply.ref_id in self.abandoned:  # its work stopped (a release): the site's word on it changes nothing
                log.debug("late %s for request %s, given up when its work stopped", reply.type, reply.ref_id)
            else:
                log.warning("discarding a late %s for request %s (no longer waited for)", reply.type, reply.ref_id)
            return
        future.set_result(reply)
