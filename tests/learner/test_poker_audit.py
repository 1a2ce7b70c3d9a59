"""Poker hands (the sandbox's env = "poker") through the agent's rollout and the learner's audit: a worker's hands
replay in the audit (texts, rewards, log-probs), a claimed result that is not the hand's fails, and ChatML turns
decode to the text the replay reads."""

from __future__ import annotations

import copy
import random

import pytest

from dataplane.packed import pack_records
from dataplane.records import TrajectoryGroup
from dataplane.replay import StoredGroup
from dataplane.tasks import build_task
from dataplane.tasks.episodes import Turn
from learner.audit import Auditor, AuditSettings, reward_check, text_mismatches
from learner.tiny import build_tiny_model, build_tokenizer
from worker_agent.engines import make_engine
from worker_agent.engines.base import SamplingParams
from worker_agent.rollout import GroupLease, rollout_groups

pytest.importorskip("pokerkit")


def auditor(model_dir, task) -> Auditor:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    return Auditor(copy.deepcopy(model).eval(), pad_id=tokenizer.pad_token_id, task=task,
                   weights=lambda v: base if v == 0 else None,
                   decode=lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True),
                   settings=AuditSettings(fraction=1.0, probation_groups=0), key=b"k" * 32)


@pytest.mark.parametrize(("opponent", "prefix"), [("heuristic", False), ("self", False), ("heuristic", True),
                                                  ("self", True)])
def test_a_workers_hands_pass_the_learners_audit_and_a_changed_result_fails(opponent, prefix, tmp_path) -> None:
    task = build_task({"name": "sandbox", "env": "poker", "opponent": opponent, "max_turns": 3,
                       "answer_prefix": prefix})
    model_dir = build_tiny_model(tmp_path / "poker", alphabet=task.alphabet, hidden=32, layers=1)
    engine = make_engine("hf", str(model_dir), device="cpu", seed=0)
    prompts = task.sample_prompts(random.Random(1), 3)
    leases = [GroupLease(f"l{i}", f"g{i}", p.text) for i, p in enumerate(prompts)]
    groups = rollout_groups(engine, task, leases, job_id=1, n=2, version=0,
                            params=SamplingParams(max_new_tokens=6, temperature=1.0))
    audit = auditor(model_dir, build_task(task.spec()))  # the learner builds its own from the job's spec
    for i, group in enumerate(groups):
        assert audit.check(StoredGroup(f"{i}-0", group, worker_id=1)) == ""
        for record in group.records:
            assert record.metadata["decisions"] >= record.metadata["illegal"]
            assert record.reward + record.metadata["opponent_return"] == 0
            assert record.completion.startswith("<answer>") == (prefix and "opponent acts first" not in record.prompt)
    claimed = TrajectoryGroup.of([r.model_copy(update={"reward": r.reward + 1.0}) for r in groups[0].records])
    assert audit.check(StoredGroup("9-0", claimed, worker_id=1)).startswith("records.0.reward: claimed")


def test_chatml_turns_decode_to_the_text_the_replay_reads() -> None:
    """Each environment message is a ChatML user turn (<|im_end|>, <|im_start|>user ... <|im_start|>assistant) and
    the answer's opener <answer> (a chat job's default): the engines and the audit decode without special tokens,
    and the record's text is that decoding, so the text check passes and the reward replays."""
    task = build_task({"name": "sandbox", "env": "poker", "opponent": "random", "turn_format": "chatml"})
    tokenizer = build_tokenizer(task.alphabet)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = [p.text for p in task.sample_prompts(random.Random(2), 6)]

    def generate(contexts):  # call or check; every other turn ends at the end-of-turn token, as a chat model may
        turns = []
        for k, ids in enumerate(contexts):
            assert tokenizer.decode(ids).endswith("<answer>")  # opened by the environment
            facing_a_bet = "<answer>call" in tokenizer.decode(ids)[-300:]
            text = ("call" if facing_a_bet else "check") + ("" if k % 2 else "</answer>")
            tids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([end] if k % 2 else [])
            turns.append(Turn(ids=tids, logprobs=[-1.0] * len(tids), text=tokenizer.decode(tids,
                                                                                        skip_special_tokens=True)))
        return turns

    episodes = task.play(prompts, generate=generate, encode=lambda t: tokenizer(t, add_special_tokens=False)[
        "input_ids"], prompt_ids=[tokenizer(p)["input_ids"] for p in prompts])
    records = [ep.record(job_id=1, lease_id="l", group_id="g", version=0) for ep in episodes]
    assert all(r.completion_ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) >= 2 for r in records)
    assert "\nuser\nActions: " in records[0].completion and "<|im_" not in records[0].completion
    assert any(f"\nassistant\n<answer>{a}" in r.completion for r in records for a in ("call", "check"))
    stored = [StoredGroup(f"{i}-0", TrajectoryGroup.of([r]), worker_id=2) for i, r in enumerate(records)]
    assert text_mismatches(stored, lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True)) == {}
    assert reward_check(pack_records(records), task, tolerance=1e-9)[0] == ""
    assert max(r.metadata["decisions"] for r in records) >= 2 and not any(r.metadata["illegal"] for r in records)
    plain = build_task({**task.spec(), "turn_format": "plain"})
    with pytest.raises(ValueError, match="turn_format: chatml needs a tokenizer with ChatML"):
        task.play(prompts[:1], generate=generate, encode=lambda t: list(t.encode()))
    assert plain.spec()["turn_format"] == "plain"
