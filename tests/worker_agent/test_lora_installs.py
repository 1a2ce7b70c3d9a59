"""LoRA jobs through real agents (docs/lora.md): the learner publishes its base once, then adapters; a chain of two
agent sessions (real relay hubs on loopback, a recording socket for the site) installs v1..v3 on one base, each
version's adapter applied in place (the base's tensors never reloaded), and generates with the newest; an agent that
joins late takes the base, then only the newest adapter."""

from __future__ import annotations

import asyncio

import torch
from transformers import AutoModelForCausalLM

from dataplane.lora import ADAPTER_FORMAT, LoraSpec
from learner import lora
from learner.serving import LearnerRelay, SnapshotServer
from learner.snapshots import SnapshotStore
from worker_agent.engines.base import SamplingParams

from .test_deltas import HEAD, LATE, TAIL, chain_of_agents, down_the_chain, join, offered, stop_all
from .test_session import SECRET, push, until

SPEC = LoraSpec(rank=4, target_modules=["q_proj", "v_proj", "down_proj"])


def greedy(model, tokenizer, prompt: str, tokens: int = 4) -> list[int]:
    """The policy's greedy continuation, computed here (no engine), whole-sequence forward per token."""
    ids = tokenizer(prompt)["input_ids"]
    out = []
    with torch.no_grad():
        for _ in range(tokens):
            nxt = int(model(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax())
            out.append(nxt)
            if nxt == tokenizer.eos_token_id:
                break
    return out


def test_agents_install_adapters_on_one_base_and_a_late_one_takes_only_the_newest(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    store = SnapshotStore(tmp_path / "snapshots", job_id=1, chunk_bytes=2048, adapter=SPEC)
    server, relay = SnapshotServer(store).start(), LearnerRelay(store, uplink_bps=None, mode="thread")
    server.set_secret(SECRET)
    relay.set_secret(SECRET)
    base = store.write_base(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    learner = lora.wrap(AutoModelForCausalLM.from_pretrained(tiny_model_dir), SPEC).eval()
    published = []

    def publish(version: int):
        with torch.no_grad():  # a training step's worth of change, on the adapter alone
            for name, parameter in learner.named_parameters():
                if ".lora_" in name:
                    parameter.add_(torch.randn_like(parameter) * 0.5)
        manifest = store.write(learner, version)
        relay.serve(version)
        bf16 = {k: v.to(torch.bfloat16) for k, v in lora.adapter_state(learner.state_dict()).items()}
        published.append((manifest, bf16))
        return manifest

    def as_published(version_index: int):
        """The learner's policy with the adapter as it travelled (bf16), for the answers to compare."""
        model = lora.wrap(AutoModelForCausalLM.from_pretrained(tiny_model_dir), SPEC).eval()
        lora.load_adapter(model, {k: v.float() for k, v in published[version_index][1].items()})
        return model

    async def scenario() -> None:
        sessions = chain_of_agents(tmp_path)
        for worker_id in (HEAD, TAIL):
            await join(sessions[worker_id][0], store, server, base, worker=f"worker {worker_id}")
        engine = sessions[TAIL][0].installs.job.engine
        base_storage = {v.data_ptr() for v in engine.model.state_dict().values()}
        for version in (1, 2, 3):
            await down_the_chain(sessions, publish(version), server, relay.address)
        assert all(manifest.format == ADAPTER_FORMAT for manifest, _ in published)
        assert max(manifest.total_bytes for manifest, _ in published) < base.total_bytes / 4
        assert [(r["version"], r["source"]) for r in sessions[TAIL][1].of("snapshot_installed")] == [
            (0, "http"), (1, "parent"), (2, "parent"), (3, "parent")]
        held = {v.data_ptr() for k, v in engine.model.state_dict().items() if ".lora_" not in k}
        assert held == base_storage  # the base's own tensors, never reloaded (q_proj.weight is now its base_layer's)
        assert engine.adapter_version == 3
        policy = as_published(-1)
        prompts = ["3+4=", "2+2=", "9+1="]
        params = SamplingParams(max_new_tokens=4, temperature=0.0)
        answers = [g[0].completion_ids for g in engine.generate(prompts, n=1, params=params)]
        assert answers == [greedy(policy, tokenizer, p) for p in prompts]  # generated with the newest adapter
        older = as_published(0)
        assert any(greedy(older, tokenizer, p) != a for p, a in zip(prompts, answers, strict=True))

        late, late_socket = sessions[LATE]  # joins at v3: the base, then v3's adapter alone
        await join(late, store, server, base, worker="the late agent")
        await push(late, offered(published[-1][0], server, worker_id=LATE))
        await until(lambda: late.installs.installed_version(1) == 3, "v3 on the late agent")
        assert [(r["version"], r["source"]) for r in late_socket.of("snapshot_installed")] == [(0, "http"), (3, "http")]
        assert [g[0].completion_ids for g in late.installs.job.engine.generate(prompts, n=1, params=params)] == answers
        await stop_all(sessions)

    try:
        asyncio.run(scenario())
    finally:
        relay.stop()
        server.stop()
