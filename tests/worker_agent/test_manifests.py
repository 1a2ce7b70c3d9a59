"""The agent gets each version's manifest by the reference in its ``snapshot`` message: fetched once from the
learner's server (a real snapshot store over HTTP), installed only when it hashes to that reference."""

from __future__ import annotations

import asyncio
import json
import logging

import torch
from transformers import AutoModelForCausalLM

from dataplane import messages as m
from dataplane.broadcast.store import CHUNKS, MANIFEST, version_dir

from .test_session import (  # noqa: F401 - learner_side is a fixture
    answer_each,
    answering,
    assign,
    learner_side,
    make_session,
    push,
    snapshot,
    submits,
    until,
)


def trained(tiny_model_dir, shift: float):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.model.norm.weight.add_(shift)
    return model


def test_a_manifest_that_is_not_the_one_announced_is_refused_and_nothing_is_generated_under_it(
        tmp_path, learner_side, tiny_model_dir, caplog):  # noqa: F811 - the fixture imported above
    store, server = learner_side
    base = store.write_base(tiny_model_dir)
    model = trained(tiny_model_dir, 1.0)
    v1 = store.write(model, 1)
    served = version_dir(store.root, 1) / MANIFEST
    honest = served.read_text()
    forged = json.loads(honest)
    forged["chunks"][0]["sha256"] = "0" * 64  # well formed: only its digest tells it from the one the site checked
    served.write_text(json.dumps(forged))

    async def scenario() -> None:
        session, socket = make_session(tmp_path, [])
        await push(session, assign(1, snapshot(store, server, base), digest=base.sha256))
        await until(lambda: submits(socket), "the first lease request")
        with caplog.at_level(logging.ERROR, logger="echo2.agent"):
            await push(session, snapshot(store, server, v1))
            await until(lambda: session.installs.wanted.get(1) == 1, "the refused install to be noted")
        refusal = [r.getMessage() for r in caplog.records if "install failed" in r.getMessage()]
        assert len(refusal) == 1 and "v1/manifest.json: refused: it hashes to" in refusal[0], refusal
        assert "the site announced" in refusal[0]
        await push(session, answering(socket, m.NoWork(job_id=1, retry_after=0.05)))
        await until(lambda: any(r["which"] == "newest" for r in socket.of("snapshot_request")),
                    "the agent to ask for the newest version again")
        leases = len(submits(socket))
        await asyncio.sleep(0.5)
        assert len(submits(socket)) == leases, "leased while its newest version's manifest was refused"
        assert [r["version"] for r in socket.of("snapshot_installed")] == [0]

        served.write_text(honest)  # the learner serves the manifest the site announced
        await push(session, snapshot(store, server, v1))
        await until(lambda: len(submits(socket)) > leases, "leasing again once v1 is installed")
        assert [r["version"] for r in socket.of("snapshot_installed")] == [0, 1]
        assert session.installs.job.engine.model.model.norm.weight.detach().equal(model.model.norm.weight.detach())
        session._stop_rollout()

    asyncio.run(scenario())


def test_each_versions_manifest_is_fetched_once_however_often_the_version_is_announced(
        tmp_path, learner_side, tiny_model_dir):  # noqa: F811 - the fixture imported above
    store, server = learner_side
    base = store.write_base(tiny_model_dir)
    model = trained(tiny_model_dir, 2.0)
    v1 = store.write(model, 1)
    chunk = version_dir(store.root, 1) / CHUNKS / "0"
    held = chunk.read_bytes()
    chunk.unlink()  # the manifest is served, a chunk is not (yet): the install fails after the manifest came

    async def scenario() -> None:
        session, socket = make_session(tmp_path, [])
        await push(session, assign(1, snapshot(store, server, base), digest=base.sha256))
        await until(lambda: submits(socket), "the first lease request")
        assert session.installs.manifests.fetched == 1  # the base's
        await push(session, snapshot(store, server, v1))
        await until(lambda: session.installs.wanted.get(1) == 1, "the failed install to be noted")
        assert session.installs.manifests.fetched == 2

        chunk.write_bytes(held)
        await push(session, snapshot(store, server, v1))  # the site's answer to the agent's snapshot_request
        await answer_each(session, socket, m.NoWork(job_id=1, retry_after=0.05),
                          lambda: session.installs.installed_version(1) == 1, "v1 installed")
        assert session.installs.manifests.fetched == 2  # v1's manifest was held: not fetched again
        await push(session, snapshot(store, server, v1))  # a repeat (a reroute, a re-sent assignment): nothing new
        await asyncio.sleep(0.3)
        assert session.installs.manifests.fetched == 2
        assert [r["version"] for r in socket.of("snapshot_installed")] == [0, 1]
        session._stop_rollout()

    asyncio.run(scenario())
