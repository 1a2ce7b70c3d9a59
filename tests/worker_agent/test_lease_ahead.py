"""Lease ahead: once a batch's generation has been timed, the agent asks for the next lease while the
current batch generates, so on a long link generation does not wait a round trip per batch. Driven message by
message against a real session and a real engine whose generation the test holds (a recording socket stands in
for the site): the next lease goes out before the generating batch's groups, one lease at most is held ahead,
none is taken where two batches would not fit the site's lease timeout, a lease ahead that cannot be generated is
handed back, and every leased group is returned exactly once."""

from __future__ import annotations

import asyncio
import threading

from dataplane import messages as m
from worker_agent.engines import make_engine

from .test_session import answering, assign, learner_side, make_session, push, returned, snapshot, submits, until  # noqa: F401


class Held:
    """A real engine whose batches wait while the test holds ``gate`` (cleared), as a long batch would."""

    def __init__(self, engine, gate: threading.Event) -> None:
        self.engine, self.gate = engine, gate
        self.batches = 0

    def generate(self, *args, **kwargs):
        if not self.gate.wait(30):
            raise RuntimeError("the test never let the batch go")
        self.batches += 1
        return self.engine.generate(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.engine, name)


def lease(lease_id: str, prompt: str = "1+2=", timeout: float = 30.0) -> m.Lease:
    return m.Lease(job_id=1, timeout=timeout, leases=[m.LeasedPrompt(lease_id=lease_id, group_id=f"g-{lease_id}",
                                                                     prompt=prompt)])


async def started(tmp_path, learner_side, tiny_model_dir):  # noqa: F811
    """A session on job 1 whose first batch (l1) was generated serially (timing it) and is being returned with the
    next lease request; its engine's batches wait while the returned gate is cleared."""
    store, server = learner_side
    base = store.write_base(tiny_model_dir)
    gate = threading.Event()
    gate.set()
    session, socket = make_session(tmp_path, [])
    session.installs.engine_factory = lambda model_dir: Held(make_engine("hf", model_dir, device="cpu", seed=0), gate)
    await push(session, assign(1, snapshot(store, server, base), digest=base.sha256))
    await until(lambda: submits(socket), "the first lease request")
    await push(session, answering(socket, lease("l1")))
    await until(lambda: returned(socket), "l1's group returned")
    assert len(submits(socket)) == 2 and submits(socket)[-1]["lease"] >= 1  # serial: nothing timed before l1
    return session, socket, gate


def test_the_next_lease_is_asked_for_while_a_batch_generates_and_every_group_returns_once(tmp_path, learner_side,  # noqa: F811
                                                                                           tiny_model_dir):
    async def scenario() -> None:
        session, socket, gate = await started(tmp_path, learner_side, tiny_model_dir)
        gate.clear()  # l2's batch takes as long as the test says
        await push(session, answering(socket, lease("l2", "2+2=")))
        await until(lambda: len(submits(socket)) == 3, "the lease ahead, while l2 generates")
        ahead = submits(socket)[-1]
        assert ahead["groups"] == [] and ahead["lease"] >= 1  # only the lease: l1 went back already
        await asyncio.sleep(0.3)
        assert len(submits(socket)) == 3, "more than one lease asked for ahead"
        await push(session, answering(socket, lease("l3", "3+3="), request=ahead))
        gate.set()
        await until(lambda: len(submits(socket)) == 4, "l2's group back, with the lease ahead of l3's batch")
        assert [g["lease_id"] for g in submits(socket)[-1]["groups"]] == ["l2"] and submits(socket)[-1]["lease"] >= 1
        await push(session, answering(socket, m.NoWork(job_id=1, retry_after=30)))  # the site has no more
        await until(lambda: len(submits(socket)) == 5, "l3's group back")
        await push(session, answering(socket, m.NoWork(job_id=1, retry_after=30)))
        await asyncio.sleep(0.2)
        assert [g["lease_id"] for g in returned(socket)] == ["l1", "l2", "l3"]  # each once, none lost
        assert socket.of("lease_return") == []
        session._stop_rollout()

    asyncio.run(scenario())


def test_no_lease_is_taken_ahead_where_two_batches_would_not_fit_the_sites_lease_timeout(tmp_path, learner_side,  # noqa: F811
                                                                                          tiny_model_dir):
    """A lease of 10 ms: a lease taken ahead would expire before its batch even started (re-leased to another
    worker, our group refused). The agent goes back to one round trip per batch."""
    async def scenario() -> None:
        session, socket, gate = await started(tmp_path, learner_side, tiny_model_dir)
        gate.clear()
        await push(session, answering(socket, lease("l2", "2+2=", timeout=0.01)))
        await asyncio.sleep(0.5)
        assert len(submits(socket)) == 2, "leased ahead past the site's lease timeout"
        gate.set()
        await until(lambda: len(submits(socket)) == 3, "l2's group back with the next lease")
        assert [g["lease_id"] for g in submits(socket)[-1]["groups"]] == ["l2"] and submits(socket)[-1]["lease"] >= 1
        session._stop_rollout()

    asyncio.run(scenario())


def test_a_lease_taken_ahead_that_cannot_be_generated_is_handed_back_at_once(tmp_path, learner_side, tiny_model_dir):  # noqa: F811
    """While l2 generates, the lease ahead (l3) arrives, then the agent learns it must reach a newer version
    before generating again (a reconnect's assignment names v5): l3 goes back to the site at once (leased again
    to whoever asks), l2's group is still returned, and l3 is never generated."""
    async def scenario() -> None:
        session, socket, gate = await started(tmp_path, learner_side, tiny_model_dir)
        gate.clear()
        await push(session, answering(socket, lease("l2", "2+2=")))
        await until(lambda: len(submits(socket)) == 3, "the lease ahead")
        await push(session, answering(socket, lease("l3", "3+3=")))
        session.installs.wanted[1] = 5  # what the site's re-sent assignment does: v5 before any more generation
        gate.set()
        await until(lambda: socket.of("lease_return"), "the lease ahead handed back")
        assert [r["lease_id"] for r in socket.of("lease_return")] == ["l3"]
        await until(lambda: "l2" in [g["lease_id"] for g in returned(socket)], "l2's group returned")
        assert submits(socket)[-1]["lease"] == 0  # no lease it cannot answer
        await asyncio.sleep(0.2)
        assert [g["lease_id"] for g in returned(socket)] == ["l1", "l2"]
        session._stop_rollout()

    asyncio.run(scenario())


def test_no_lease_is_taken_ahead_soon_after_the_site_had_no_work(tmp_path, learner_side,  # noqa: F811
                                                                 tiny_model_dir):
    """Prompts are scarce: a lease taken ahead would sit here while another worker idles, and the request would
    mostly come back empty. For LEASE_AHEAD_DRY_S after a "no work" the agent leases one batch at a time."""
    async def scenario() -> None:
        session, socket, gate = await started(tmp_path, learner_side, tiny_model_dir)
        await push(session, answering(socket, m.NoWork(job_id=1, retry_after=0.05)))
        await until(lambda: len(submits(socket)) == 3, "the lease asked for again")
        gate.clear()
        await push(session, answering(socket, lease("l2", "2+2=")))
        await asyncio.sleep(0.5)
        assert len(submits(socket)) == 3, "leased ahead right after the site had no work"
        gate.set()
        await until(lambda: len(submits(socket)) == 4, "l2's group back with the next lease")
        assert [g["lease_id"] for g in submits(socket)[-1]["groups"]] == ["l2"] and submits(socket)[-1]["lease"] >= 1
        session._stop_rollout()

    asyncio.run(scenario())
