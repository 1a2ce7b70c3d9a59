"""A ``dataset`` job whose owner wrote its reward function, on a real agent session whose provider did not opt in to
user code (a recording socket stands in for the site; base and data set from a real learner snapshot server): the
function is scored on the learner (docs/rewards.md), so the agent neither refuses the job nor needs a copy of the
code (the module does not exist here); it returns the completions with the built-in's score alone."""

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


def test_an_agent_without_the_opt_in_serves_a_job_whose_owner_function_the_learner_scores(
        tmp_path, learner_side, tiny_model_dir) -> None:  # noqa: F811 - the fixture imported above
    store, server = learner_side
    base = store.write_base(tiny_model_dir)
    digest = served(store, sums_data_set(tmp_path / "owner-data", answer_column="answer"))
    task = {"name": "dataset", "data": {"digest": digest, "format": "jsonl", "prompt_column": "q"},
            "reward": ["exact_match", {"function": "only_on_the_owners_machine.rewards:judge", "weight": 2.0}]}

    async def scenario() -> None:
        session, socket = make_session(tmp_path, [])
        assert not session.config.allow_user_code
        available = snapshot(store, server, base)
        await push(session, m.Assign(job_id=1, model="/learner/only/path", task=task, group_size=2, max_new_tokens=2,
                                     temperature=1.0, base_digest=base.sha256,
                                     base=available.model_dump(mode="json")))
        await until(lambda: submits(socket), "a lease request: the job is served, not refused")
        assert not [s for s in socket.of("state") if s.get("state") == "failed"], socket.of("state")
        lease = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l1", group_id="g1", prompt="1+2=")])
        await push(session, answering(socket, lease))
        await until(lambda: returned(socket), "a generated group")
        group = returned(socket)[0]
        assert [r["reward"] for r in group["records"]] == [1.0 if r["completion"].strip() == "3" else 0.0
                                                          for r in group["records"]]  # the built-in's part only
        assert not group.get("reward_errors"), "the owner's function is not run here, so it cannot fail here"
        session._stop_rollout()

    asyncio.run(scenario())
