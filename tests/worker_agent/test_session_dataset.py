"""A ``dataset`` job on a real agent session (a recording socket stands in for the site; the base snapshot and the
data set come from a real learner snapshot server over loopback, with the job's credentials): the agent fetches the
data set by digest with the job's base, before it leases anything, scores its completions against the rows, and a
later session on the same cache fetches nothing (the learner is gone by then)."""

from __future__ import annotations

import asyncio

from dataplane import messages as m

from .test_session import (  # noqa: F401 (learner_side: a fixture)
    answering,
    learner_side,
    make_session,
    push,
    returned,
    served,
    snapshot,
    submits,
    sums_data_set,
    until,
)


def dataset_assign(base: m.SnapshotAvailable, digest: str, *, base_digest: str) -> m.Assign:
    task = {"name": "dataset", "reward": "exact_match",
            "data": {"digest": digest, "format": "jsonl", "prompt_column": "q", "answer_column": "a"}}
    return m.Assign(job_id=1, model="/learner/only/path", task=task, group_size=2, max_new_tokens=2,
                    temperature=1.0, base_digest=base_digest, base=base.model_dump(mode="json"))


def test_an_agent_fetches_the_jobs_data_set_with_its_base_and_a_later_session_uses_its_cache(
        tmp_path, learner_side, tiny_model_dir) -> None:  # noqa: F811 - the fixture imported above
    store, server = learner_side
    base = store.write_base(tiny_model_dir)
    files = sums_data_set(tmp_path / "owner-data")
    digest = served(store, files)

    async def scenario() -> None:
        session, socket = make_session(tmp_path, [])
        await push(session, dataset_assign(snapshot(store, server, base), digest, base_digest=base.sha256))
        await until(lambda: submits(socket), "the first lease request, once base and data set are in")
        assert (tmp_path / "cache" / digest / "train.jsonl").read_text() == (files / "train.jsonl").read_text()
        lease = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l1", group_id="g1", prompt="1+2=")])
        await push(session, answering(socket, lease))
        await until(lambda: returned(socket), "a generated group")
        records = returned(socket)[0]["records"]
        assert [r["reward"] for r in records] == [1.0 if r["completion"].strip() == "3" else 0.0 for r in records]
        session._stop_rollout()

        server.stop()  # the learner is gone: the next session must find base and data set in its cache
        later, later_socket = make_session(tmp_path, [])
        await push(later, dataset_assign(snapshot(store, server, base), digest, base_digest=base.sha256))
        await until(lambda: submits(later_socket), "a lease request from the cache alone")
        assert [r["source"] for r in later_socket.of("snapshot_installed")] == ["cache"]
        later._stop_rollout()

    asyncio.run(scenario())
