"""Audits as evidence: every record's text is checked against its token ids (the forgery "text set to
the right answer, ids left as the wrong sample" is caught on every group, sampled or not), new workers are on
probation (audited in full, then less as they pass; back to full after a failure), and each verdict carries what
was checked (entry, group, claimed against recomputed reward and log-prob, the texts that differ)."""

from __future__ import annotations

import random

import pytest

from dataplane.records import TrajectoryGroup
from dataplane.replay import StoredGroup
from dataplane.tasks import build_task
from dataplane.tasks.sandbox import Turn, run_episodes
from learner.audit import audit_fraction, text_mismatches
from learner.tiny import build_tiny_model
from worker_agent.engines import make_engine

from .test_audit import auditor, forged, honest_group


def right_answer(prompt: str) -> str:
    a, b = prompt.rstrip("=").split("+")
    return str(int(a) + int(b))


def test_the_probation_schedule() -> None:
    shares = [audit_fraction(k, base=0.05, probation=16) for k in range(400)]
    assert shares[:16] == [1.0] * 16  # a new worker: every group
    assert shares[16] == pytest.approx(16 / 17) and shares[31] == pytest.approx(0.5)  # falls as probation / k
    assert all(a >= b for a, b in zip(shares, shares[1:], strict=False))  # never rises while it passes
    assert min(shares) == 0.05 and shares[319] == 0.05  # the base from k ~ probation / base on
    assert audit_fraction(3, base=0.0, probation=16) == 0.0  # audits off: probation too
    assert audit_fraction(0, base=0.05, probation=0) == 0.05


def test_text_set_to_the_right_answer_with_the_wrong_ids_fails_every_group(tiny_model_dir) -> None:
    """The forgery of issue 26 (25 of 25 audits passed before): with no group sampled at all (base fraction 0, no
    probation), every forged group fails on its text; honest groups are not touched."""
    audit = auditor(tiny_model_dir, fraction=0.0)
    prompts = [f"{a}+{b}=" for a, b in [(3, 4), (2, 5), (1, 1), (6, 2), (4, 4), (9, 0)]]
    honest = [honest_group(tiny_model_dir, p, lease=f"l{i}") for i, p in enumerate(prompts)]
    lying = [forged(g, completion=lambda r: right_answer(r.prompt), reward=lambda r: 1.0) for g in honest]
    assert all(r.completion != right_answer(r.prompt) for g in honest for r in g.records[:1])  # an untrained model
    stored = [StoredGroup(f"{i}-0", g, worker_id=3) for i, g in enumerate(honest)]
    stored += [StoredGroup(f"{i}-1", g, worker_id=4) for i, g in enumerate(lying)]

    kept, failed = audit.screen(stored)
    assert [g.worker_id for g in kept] == [3] * len(honest) and failed == {4}
    report = {r["worker_id"]: r for r in audit.report()}
    assert 3 not in report  # nothing sampled: the honest worker's texts passed without counting as audits
    assert report[4]["failed"] == len(lying) and "the text is not its token ids decoded" in report[4]["reason"]
    first = report[4]["evidence"][0]
    assert first["check"] == "text" and first["entry_id"] == "0-1" and first["group_id"] == "g-l0"
    assert first["claimed_text"] == "7" and first["decoded_text"] == honest[0].records[0].completion


def test_a_multi_turn_episode_passes_the_text_check(tmp_path) -> None:
    """A sandbox record joins each turn's decoded text with the environment's replies: the check decodes each run
    of equal loss-mask values on its own, as the episode was built, so honest episodes pass."""
    task = build_task({"name": "sandbox", "env": "nim", "max_turns": 3})
    model_dir = build_tiny_model(tmp_path / "nim", alphabet=task.alphabet, hidden=32, layers=1)
    engine = make_engine("hf", str(model_dir), device="cpu", seed=1)
    prompts = [task.sample_prompts(random.Random(0), 1)[0].text] * 4

    def generate(contexts):  # a player that takes one stone each turn, its text decoded from its ids
        ids = engine.tokenizer("<answer>1</answer>", add_special_tokens=False)["input_ids"]
        ids.append(engine.tokenizer.eos_token_id)
        return [Turn(ids=ids, logprobs=[-1.0] * len(ids), text=engine.tokenizer.decode(ids, skip_special_tokens=True))
                for _ in contexts]

    episodes = run_episodes(task, prompts, generate=generate, prompt_ids=[engine.encode_prompt(p) for p in prompts],
                            encode=lambda t: engine.tokenizer(t, add_special_tokens=False)["input_ids"])
    records = [ep.record(job_id=1, lease_id="l", group_id="g", version=0) for ep in episodes]
    assert any(0 in r.loss_mask for r in records)  # some episode got an environment reply
    stored = StoredGroup("1-0", TrajectoryGroup.of(records), worker_id=2)
    decode = lambda ids: engine.tokenizer.batch_decode(ids, skip_special_tokens=True)  # noqa: E731
    assert text_mismatches([stored], decode) == {}
    swapped = TrajectoryGroup.of([records[0].model_copy(update={"completion": records[0].completion[::-1] + "x"}),
                                  *records[1:]])
    assert list(text_mismatches([StoredGroup("2-0", swapped, worker_id=2)], decode)) == ["2-0"]


def test_a_new_worker_is_audited_in_full_until_probation_ends_and_again_after_a_failure(tiny_model_dir) -> None:
    audit = auditor(tiny_model_dir, fraction=0.05, probation=3)
    group = honest_group(tiny_model_dir)
    audited = []
    for i in range(6):
        audit.screen([StoredGroup(f"{i}-0", group, worker_id=7)])
        audited.append(audit.outcomes[7].passed)
    assert audited[:3] == [1, 2, 3]  # probation: every group
    assert audit.seen[7] == 6
    liar = forged(group, reward=lambda r: 1.0 - r.reward)
    # A failure (found by the text-independent reward check on a sampled group) sends it back to full audit.
    kept, failed = audit.screen([StoredGroup("99-0", liar, worker_id=7)], audit.check_many(
        [StoredGroup("99-0", liar, worker_id=7)]))
    assert failed == {7} and audit.seen[7] == 0
    assert audit_fraction(audit.seen[7], base=0.05, probation=3) == 1.0


def test_each_verdict_carries_what_was_checked(tiny_model_dir) -> None:
    audit = auditor(tiny_model_dir, fraction=1.0)
    group = honest_group(tiny_model_dir)
    made_up = forged(group, logprobs=lambda r: [-0.01] * len(r.logprobs))
    flipped = forged(group, reward=lambda r: 1.0 - r.reward)
    audit.screen([StoredGroup("1-0", group, worker_id=1), StoredGroup("2-0", made_up, worker_id=2),
                  StoredGroup("3-0", flipped, worker_id=3)])
    report = {r["worker_id"]: r for r in audit.report()}
    passed, = report[1]["evidence"]
    assert passed["passed"] and passed["check"] == "all" and passed["logprob_gap"] < 1e-4
    assert passed["claimed_reward"] == passed["recomputed_reward"]
    lie, = report[2]["evidence"]
    assert (lie["check"], lie["passed"], lie["entry_id"], lie["version"]) == ("logprobs", False, "2-0", 0)
    assert lie["claimed_logprob"] == pytest.approx(-0.01) and lie["recomputed_logprob"] < -1.0
    assert lie["logprob_gap"] == pytest.approx(lie["claimed_logprob"] - lie["recomputed_logprob"], rel=1e-3)
    wrong, = report[3]["evidence"]
    assert wrong["check"] == "reward" and wrong["claimed_reward"] == 1.0 - wrong["recomputed_reward"]
    assert "logprob_gap" in wrong  # its log-probs were recomputed too (and were right)
