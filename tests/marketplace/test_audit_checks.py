"""The site's check of one reported failure (marketplace/core/audit_checks.py), pure: no database, no Redis. Each
verdict against hand-made evidence of a stored group, as the learner's Verdict evidence states it."""

from __future__ import annotations

import pytest

from dataplane.records import Trajectory, TrajectoryGroup
from dataplane.stored import StoredGroup
from dataplane.tasks import build_task
from marketplace.core.audit_checks import (
    COMPLETION,
    PROMPT,
    check_failure,
    claimed_logprob,
    counted_failures,
    decoded_verdict,
    mask_runs,
    one_turn_task,
    text_item,
)

TASK = build_task({"name": "arithmetic"})


def stored(*, worker_id: int = 4, reward: float = 0.0, completion: str = "the answer is 7") -> StoredGroup:
    records = [Trajectory(job_id=1, lease_id="l", group_id="g-1", prompt="3+4=", prompt_ids=[1, 10, 5, 11],
                          completion=completion, completion_ids=[12, 2, 9], logprobs=[-1.0, -2.0, -3.0],
                          loss_mask=[1, 1, 0], reward=reward, version=2) for _ in range(2)]
    return StoredGroup("5-0", TrajectoryGroup.of(records), worker_id=worker_id)


def head(**extra) -> dict:
    return {"entry_id": "5-0", "group_id": "g-1", "version": 2, "passed": False, "record": 1, **extra}


def check(evidence: dict, group: StoredGroup | None, worker_id: int = 4) -> tuple[str, str]:
    verdict = check_failure(evidence, group, worker_id=worker_id, scorer=TASK, scorer_problem="")
    return verdict.status, verdict.why


def test_the_claimed_log_prob_is_the_mean_over_learning_tokens() -> None:
    assert claimed_logprob(stored()) == pytest.approx(-1.5)  # (-1 - 2) per record; the masked -3 does not count


@pytest.mark.parametrize(("evidence", "status", "why"), [
    (head(check="reward", claimed_reward=0.0), "refused", "is the task's"),  # "the answer is 7" scores 0 for 3+4
    (head(check="reward", claimed_reward=1.0), "refused", "claimed reward is 0"),
    (head(check="logprobs", claimed_logprob=-1.5, recomputed_logprob=-4.0, logprob_gap=2.5), "consistent", ""),
    (head(check="logprobs", claimed_logprob=-0.05, recomputed_logprob=-4.0, logprob_gap=3.95), "refused",
     "the worker claimed -1.5"),
    (head(check="logprobs", claimed_logprob=-1.5, recomputed_logprob=-4.0, logprob_gap=1.0), "refused", "impossible"),
    (head(check="logprobs", claimed_logprob=-1.5, recomputed_logprob=0.5, logprob_gap=2.0), "refused", "impossible"),
    (head(check="logprobs", claimed_logprob=-1.5, recomputed_logprob=-1.52, logprob_gap=0.02), "unverified", "floor"),
    # a confident policy: a small mean gap, but most tokens past the learner's per-token allowance
    (head(check="logprobs", claimed_logprob=-1.5, recomputed_logprob=-1.52, logprob_gap=0.02, logprob_outside=0.9),
     "consistent", "90% of tokens"),
    (head(check="logprobs", claimed_logprob=-1.5, recomputed_logprob=-1.52, logprob_gap=0.02, logprob_outside=0.05),
     "unverified", "floor"),
    (head(check="logprobs"), "unverified", "without its claimed"),
    (head(check="text", text_at=4, claimed_text="answer is 7", decoded_text="answer is 9"), "refused", "not record"),
    (head(check="text", text_at=12, claimed_text="the answer is 7", decoded_text="the answer is 9"), "consistent",
     ""),
    (head(check="text", record=0, text_at=0, claimed_text="1 10 5 11", decoded_text="1 10 5"), "consistent", ""),
    (head(check="text", text_at=0, claimed_text="same", decoded_text="same"), "refused", "the same"),
    (head(check="reward", claimed_reward=0.0, record=2), "refused", "no record 2"),
    (head(check="reward", claimed_reward=0.0, version=3), "refused", "not the reported"),
    (head(check="reward", claimed_reward=0.0, group_id="g-2"), "refused", "not the reported"),
    (head(check="all", claimed_reward=0.0), "refused", "no failure"),
])
def test_each_verdict(evidence, status, why) -> None:
    got, reason = check(evidence, stored())
    assert got == status and why in reason, reason


def test_a_wrong_reward_is_verified_by_the_sites_own_scoring() -> None:
    status, why = check(head(check="reward", claimed_reward=1.0), stored(reward=1.0))
    assert status == "verified" and "the task gives 0" in why
    assert check_failure(head(check="reward", claimed_reward=1.0), stored(reward=1.0), worker_id=4, scorer=None,
                         scorer_problem="user code").status == "unverified"


def test_another_workers_entry_and_a_record_gone() -> None:
    assert check(head(check="reward", claimed_reward=1.0), stored(reward=1.0), worker_id=5)[0] == "refused"
    status, why = check(head(check="reward", claimed_reward=1.0), None)
    assert status == "unverified" and why.startswith("record gone")


def test_log_prob_failures_count_once_per_owner_from_the_second_owner_on() -> None:
    assert counted_failures(1, [7, 7, 7], owners_needed=2) == 1  # one owner, however often: nothing
    assert counted_failures(1, [7, 7, 8], owners_needed=2) == 3  # two owners: one each
    assert counted_failures(0, [7], owners_needed=1) == 1
    assert counted_failures(1, [7, 8, 9], owners_needed=0) == 1  # the default: only what the site verified


def _decoding(vocab: dict[int, str]):
    """A character tokenizer's decode (id 0 a special token, skipped) and encode, as the site's child runs them."""
    def decode(runs: list[list[int]]) -> list[str]:
        return ["".join(vocab[i] for i in run if i) for run in runs]

    def encode(prompt: str) -> list[int]:
        return [0, *({c: i for i, c in vocab.items()}[c] for c in prompt)]

    return decode, encode


VOCAB = {0: "", 1: "3", 2: "+", 3: "4", 4: "=", 5: "7", 6: "5", 7: " ", 8: "!"}


def text_group(*, completion: str, ids: list[int], mask: list[int] | None = None,
               prompt_ids: list[int] | None = None) -> StoredGroup:
    record = Trajectory(job_id=1, lease_id="l", group_id="g-1", prompt="3+4=", prompt_ids=prompt_ids or [0, 1, 2, 3, 4],
                        completion=completion, completion_ids=ids, logprobs=[-1.0] * len(ids), loss_mask=mask,
                        reward=0.0, version=2)
    return StoredGroup("5-0", TrajectoryGroup.of([record, record]), worker_id=4)


@pytest.mark.parametrize(("completion", "ids", "mask", "one_turn", "status", "why"), [
    ("7", [6, 0], None, True, "verified", "differ at character 0: '7' against '5'"),  # the text of another sample
    ("5", [6, 0], None, True, "refused", "the report is false"),  # its ids decoded: an owner's lie
    ("7", [6, 0], None, False, "verified", "not its ids decoded"),  # all generated tokens: any task
    # a multi-turn record: an environment reply (mask 0) is text the environment wrote
    ("5 !", [6, 7, 8], [1, 0, 0], False, "refused", "the report is false"),
    ("5 7", [6, 7, 8], [1, 0, 0], False, "consistent", "environment replies need not decode back"),
    # a one-turn task's record is its ids decoded whole, whatever mask it claims
    ("5 7", [6, 7, 8], [1, 0, 0], True, "verified", "differ at character 2"),
])
def test_a_text_failure_decoded_by_the_site(completion, ids, mask, one_turn, status, why) -> None:
    group = text_group(completion=completion, ids=ids, mask=mask)
    item = text_item(group, 1, [COMPLETION], one_turn=one_turn)
    verdict = decoded_verdict(item, **dict(zip(("decode", "encode"), _decoding(VOCAB), strict=True)))
    assert verdict.status == status and why in verdict.why, verdict.why


def test_a_prompt_failure_decoded_by_the_site() -> None:
    decode, encode = _decoding(VOCAB)
    forged = text_item(text_group(completion="7", ids=[5], prompt_ids=[0, 1, 2, 1, 4]), 0, [PROMPT], one_turn=True)
    assert decoded_verdict(forged, decode=decode, encode=encode).status == "verified"
    honest = text_item(text_group(completion="7", ids=[5]), 0, [PROMPT], one_turn=True)
    assert decoded_verdict(honest, decode=decode, encode=encode).status == "refused"


@pytest.mark.parametrize(("mask", "runs"), [([1, 1, 1, 1], [[10, 11, 12, 13]]), ([1, 0, 0, 1], [[10], [11, 12], [13]]),
                                           ([0, 1, 1, 0], [[10], [11, 12], [13]]), ([1], [[10]]), ([], [[]])])
def test_runs_are_cut_where_the_loss_mask_changes(mask, runs) -> None:
    assert mask_runs(list(range(10, 10 + len(mask))), mask) == runs


def test_which_tasks_are_one_turn() -> None:
    assert one_turn_task({"name": "arithmetic"}) and one_turn_task({"name": "countdown"})
    assert not one_turn_task({"name": "sandbox", "env": "nim"})
    assert not one_turn_task({"name": "verifiers", "env": "pkg.env:load"}) and not one_turn_task(None)
