"""A job shipping its reward code on a real agent session (a recording socket stands in for the site; base snapshot,
data set and code package from a real learner snapshot server over loopback): the opted-in agent fetches the code
package with the job's base and data, scores its completions with the owner's function imported from it, no copy
installed on the worker, and reports nothing failed."""

from __future__ import annotations

import asyncio
import dataclasses
import sys

from dataplane import messages as m
from dataplane import usercode

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

OWNER = '''
def right(prompts, completions, a, **kwargs):
    return [1.0 if c.strip() == str(x) else 0.25 for c, x in zip(completions, a)]
'''


def test_an_opted_in_agent_scores_with_the_owners_function_from_the_package(
        tmp_path, learner_side, tiny_model_dir) -> None:  # noqa: F811 - the fixture imported above
    store, server = learner_side
    base = store.write_base(tiny_model_dir)
    data = sums_data_set(tmp_path / "owner-data")
    checkout = tmp_path / "owner-checkout"
    checkout.mkdir()
    (checkout / "ownpkg_s.py").write_text(OWNER)
    package = tmp_path / "package" / usercode.ARCHIVE
    package.parent.mkdir()
    package.write_bytes(usercode.pack(["ownpkg_s"], [checkout]))
    code, digest = served(store, package), served(store, data)
    task = {"name": "dataset", "code": code, "reward": [{"function": "ownpkg_s:right", "scored_on": "worker"}],
            "data": {"digest": digest, "format": "jsonl", "prompt_column": "q", "answer_column": "a"}}

    async def scenario() -> list[dict]:
        session, socket = make_session(tmp_path, [])
        session.config = dataclasses.replace(session.config, allow_user_code=True)
        snap = snapshot(store, server, base)
        await push(session, m.Assign(job_id=1, model="/learner/only/path", task=task, group_size=2, max_new_tokens=2,
                                     temperature=1.0, base_digest=base.sha256,
                                     base=snap.model_dump(mode="json")))
        await until(lambda: submits(socket), "the first lease request, once base, data and code are in")
        lease = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l1", group_id="g1", prompt="1+2=")])
        await push(session, answering(socket, lease))
        await until(lambda: returned(socket), "a generated group")
        session._stop_rollout()
        return returned(socket)[0]

    try:
        group = asyncio.run(scenario())
        assert (tmp_path / "cache" / code / usercode.ARCHIVE).read_bytes() == package.read_bytes()
        assert sys.modules["ownpkg_s"].__file__.startswith(str(tmp_path / "cache" / code))
    finally:
        usercode.deactivate()
        sys.modules.pop("ownpkg_s", None)
    assert [r["reward"] for r in group["records"]] == [1.0 if r["completion"].strip() == "3" else 0.25
                                                       for r in group["records"]]
    assert group.get("reward_errors") is None  # the function ran on every record
