"""LoRA jobs on the learner (docs/lora.md): the adapter trains on the frozen base, its KL reference is the base with
the adapter disabled, every publication after the base is the adapter alone, a checkpoint resumes it, and the
export loads with ``from_pretrained`` (the adapter beside the base, or merged) and answers as an agent's engine."""

from __future__ import annotations

import pytest
import safetensors.torch
import torch

from dataplane.broadcast.store import full_payload, iter_chunks
from dataplane.jobs import JobSpec
from dataplane.lora import ADAPTER_FORMAT
from learner import lora
from learner.batch import collate, token_logprobs
from learner.checkpoint import CheckpointStore
from learner.export import export_version
from learner.policy import build_policy, load_model
from learner.snapshots import SnapshotStore
from worker_agent.engines.base import SamplingParams
from worker_agent.engines.hf import HFEngine
from worker_agent.weights import HeldWeights

from .test_trainer_step import make_group, on_policy


def lora_spec(model_dir, **changes) -> JobSpec:
    return JobSpec(name="lora", model_dir=str(model_dir), task={"name": "arithmetic"}, batch_trajectories=4,
                   group_size=2, learning_rate=5e-2, max_new_tokens=2, lora={"rank": 4},
                   loss={"kl_beta": 0.1}, **changes)


def records(trainer, tokenizer):
    return on_policy(trainer.module, [*make_group(tokenizer, "a", "3+4=", {"7": 1.0, "5": 0.0}),
                                      *make_group(tokenizer, "b", "2+2=", {"1": 0.0, "4": 1.0})],
                     tokenizer.pad_token_id)


def test_the_adapter_trains_alone_and_the_reference_is_the_base(tiny_model_dir) -> None:
    trainer, tokenizer = build_policy(lora_spec(tiny_model_dir), device="cpu")
    batch = records(trainer, tokenizer)
    before = {k: v.clone() for k, v in trainer.module.state_dict().items()}

    result = trainer.step(batch)

    after = trainer.module.state_dict()
    moved = {k for k in after if not torch.equal(before[k], after[k])}
    assert moved and all(".lora_" in k for k in moved)  # the adapter moved; no base weight did
    assert all(".lora_" in n for n, p in trainer.module.named_parameters() if p.requires_grad)
    adapter_params = {id(p) for n, p in trainer.module.named_parameters() if ".lora_" in n}
    assert {id(p) for p in trainer.optimizer.state} == adapter_params  # AdamW's moments for the adapter only
    assert result.stats.kl_term == 0.0  # the first step: policy == base
    base = load_model(str(tiny_model_dir)).eval()
    rows = collate(batch, pad_id=tokenizer.pad_token_id)
    with torch.no_grad():
        reference, policy, plain = (token_logprobs(m, rows) for m in (trainer.reference, trainer.module, base))
    assert torch.allclose(reference, plain, atol=1e-5)  # adapter disabled: the base itself, no second model
    assert not torch.allclose(policy, plain, atol=1e-3)  # and the adapter really changed the policy
    assert not any(isinstance(m, type(base)) for m in trainer.reference.modules() if m is not trainer.reference)


def test_publications_are_the_adapter_and_a_checkpoint_resumes_it(tiny_model_dir, tmp_path) -> None:
    spec = lora_spec(tiny_model_dir)
    trainer, tokenizer = build_policy(spec, device="cpu")
    store = SnapshotStore(tmp_path / "snapshots", job_id=1, adapter=spec.lora, chunk_bytes=4096)
    store.write_base(tiny_model_dir)
    full_store = SnapshotStore(tmp_path / "full", job_id=1, chunk_bytes=4096)
    trainer.step(records(trainer, tokenizer))

    manifest = store.write(trainer.full_state(), 1)
    full = full_store.write(load_model(str(tiny_model_dir)), 1)

    assert manifest.format == ADAPTER_FORMAT and manifest.kind == "full"
    assert manifest.total_bytes < full.total_bytes / 3
    manifest, directory = full_payload(store.root, 1)
    held = HeldWeights(manifest, list(iter_chunks(directory, manifest)))
    payload = safetensors.torch.load(b"".join(held.chunks))  # an ordinary safetensors file
    assert held.adapter() == spec.lora and set(payload) == set(held.tensors())
    assert all(k.startswith("base_model.model.") and ".lora_" in k and ".default." not in k for k in payload)

    checkpoints = CheckpointStore(tmp_path / "checkpoint")
    state = trainer.checkpoint_state(checkpoints, 1, copy=True)  # as the background committer takes it
    resumed, _ = build_policy(spec, device="cpu")
    resumed.load_state(state["model"], state["optimizer"])
    batch = records(trainer, tokenizer)
    trainer.step(batch)
    resumed.step(batch)  # the same update from the same adapter and AdamW moments
    for (name, a), b in zip(trainer.module.state_dict().items(), resumed.module.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name
    second = store.write(trainer.module, 2)
    assert second.format == ADAPTER_FORMAT and second.total_bytes <= manifest.total_bytes  # full, or a delta that pays


def test_the_export_loads_with_from_pretrained_and_answers_as_the_engine(tiny_model_dir, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    spec = lora_spec(tiny_model_dir)
    trainer, tokenizer = build_policy(spec, device="cpu")
    store = SnapshotStore(tmp_path / "snapshots" / "job1", job_id=1, adapter=spec.lora, dtype="fp32")
    store.write_base(tiny_model_dir)
    for _ in range(3):
        trainer.step(records(trainer, tokenizer))
    store.write(trainer.module, 3)

    export_version(tmp_path / "snapshots", 1, tmp_path / "adapter")
    export_version(tmp_path / "snapshots", 1, tmp_path / "merged", merged=True)

    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    with_adapter = AutoModelForCausalLM.from_pretrained(tmp_path / "adapter").eval()  # base + embedded adapter
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    engine = HFEngine(str(tiny_model_dir), device="cpu")
    manifest, directory = full_payload(store.root, 3)
    held = HeldWeights(manifest, list(iter_chunks(directory, manifest)))
    engine.load_adapter(held.tensors(), held.adapter(), version=3)
    rows = collate(records(trainer, tokenizer), pad_id=tokenizer.pad_token_id)
    with torch.no_grad():
        expected = token_logprobs(trainer.module.eval(), rows)
        for model in (with_adapter, merged, engine.model):
            assert torch.allclose(token_logprobs(model, rows), expected, atol=1e-4)
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
    prompts = ["3+4=", "2+2=", "9+1="]
    answers = [g[0].completion_ids for g in engine.generate(prompts, n=1, params=greedy)]
    exported = HFEngine(str(tmp_path / "merged"), device="cpu")
    assert [g[0].completion_ids for g in exported.generate(prompts, n=1, params=greedy)] == answers
    assert engine.adapter_version == 3 and lora.is_lora(trainer.module)


# Two ranks sum the adapter's gradients in another order than one process. Adam's first steps move each component by
# up to the learning rate (1e-2) whatever its gradient's size, so a component whose gradient is tiny turns that
# rounding into up to ~1e-5 of weight (1.3e-5 seen on one CPU, 0.13% of a step); a lost shard or optimizer state
# is off by a whole step.
LORA_ATOL = 1e-4


@pytest.mark.slow
def test_two_fsdp_ranks_train_the_adapter_as_one_process_and_checkpoints_cross_world_sizes(tmp_path,
                                                                                          tiny_model_dir) -> None:
    """FSDP2 on CPU gloo shards the frozen base with the adapter: the same two updates as one process, a sharded
    checkpoint resumed on one process and a whole one on two ranks (the optimizer's state keyed by the adapter's
    parameters alone)."""
    from .test_fsdp import _alone, _torchrun

    _alone(tiny_model_dir, tmp_path, "--mode", "reference", "--lora", "4")
    _torchrun(tiny_model_dir, tmp_path, "--mode", "fsdp", "--lora", "4")
    _alone(tiny_model_dir, tmp_path, "--mode", "resume", "--lora", "4")

    reference = torch.load(tmp_path / "reference.pt")
    sharded = torch.load(tmp_path / "fsdp.pt")
    assert sharded["ranks"] == 2 and sharded["sharded"]
    for what, got in (("2 FSDP ranks", sharded["continued"]), ("a whole checkpoint on 2 ranks", sharded["from_whole"]),
                      ("a sharded checkpoint on 1 process", torch.load(tmp_path / "resumed.pt"))):
        assert got.keys() == reference.keys(), what
        for name, tensor in reference.items():
            torch.testing.assert_close(got[name], tensor, rtol=0, atol=LORA_ATOL,
                                       msg=lambda m, n=name, w=what: f"{w}, {n}: {m}")
    base = load_model(str(tiny_model_dir)).state_dict()
    assert all(torch.equal(tensor, base[name.removeprefix("base_model.model.").replace(".base_layer", "")])
               for name, tensor in reference.items() if ".lora_" not in name)  # the base frozen throughout


def test_audits_recompute_log_probs_under_the_base_and_the_versions_adapter(tiny_model_dir, tmp_path) -> None:
    """An agent's honest group generated with v1's adapter passes the audit; the same completions claimed at v1 with
    the base's log-probs (a worker that never installed the adapter) fail it; v0's group is scored on the base."""
    import copy

    from transformers import AutoTokenizer

    from dataplane.records import Trajectory, TrajectoryGroup
    from dataplane.replay import StoredGroup
    from dataplane.tasks import build_task
    from learner.audit import Auditor, AuditSettings, snapshot_weights

    spec = lora_spec(tiny_model_dir)
    trainer, tokenizer = build_policy(spec, device="cpu")
    store = SnapshotStore(tmp_path / "snapshots", job_id=1, adapter=spec.lora)
    store.write_base(tiny_model_dir)
    with torch.no_grad():  # an adapter far enough from the base that its log-probs tell them apart
        for name, parameter in trainer.module.named_parameters():
            if ".lora_" in name:
                parameter.add_(torch.randn_like(parameter) * 0.5)
    store.write(trainer.module, 1)
    task = build_task({"name": "arithmetic"})
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    audit = Auditor(copy.deepcopy(trainer.module).eval(), pad_id=tokenizer.pad_token_id, task=task,
                    weights=snapshot_weights(store.root, str(tiny_model_dir)),
                    decode=lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True),
                    settings=AuditSettings(fraction=1.0, probation_groups=0), key=b"k" * 32)
    engines = {0: HFEngine(str(tiny_model_dir), device="cpu", seed=0), 1: HFEngine(str(tiny_model_dir), device="cpu")}
    manifest, directory = full_payload(store.root, 1)
    held = HeldWeights(manifest, list(iter_chunks(directory, manifest)))
    engines[1].load_adapter(held.tensors(), held.adapter(), version=1)

    def group(version: int, *, scored_by: int, lease: str) -> TrajectoryGroup:
        completions = engines[version].generate(["3+4="], n=3, params=SamplingParams(max_new_tokens=4))[0]
        logprobs = [c.logprobs if scored_by == version else _logprobs(engines[scored_by].model, c.prompt_ids,
                                                                       c.completion_ids) for c in completions]
        return TrajectoryGroup.of([Trajectory(
            job_id=1, lease_id=lease, group_id=f"g-{lease}", prompt="3+4=", prompt_ids=c.prompt_ids, completion=c.text,
            completion_ids=c.completion_ids, logprobs=lp, reward=task.reward("3+4=", c.text), version=version)
            for c, lp in zip(completions, logprobs, strict=True)])

    assert audit.check(StoredGroup("1-0", group(1, scored_by=1, lease="a"), worker_id=3)) == ""
    assert audit.check(StoredGroup("2-0", group(0, scored_by=0, lease="b"), worker_id=3)) == ""
    lazy = group(1, scored_by=0, lease="c")  # v1's completions, the base's log-probs
    assert audit.check(StoredGroup("3-0", lazy, worker_id=4)).startswith("logprobs: ")


def _logprobs(model, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + completion_ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    start = len(prompt_ids) - 1
    return [float(logp[start + k, t]) for k, t in enumerate(completion_ids)]
