"""The rollout asks the task how to run an episode, never its type: a multi-turn task registered here (no
sandbox) is named by a job spec, built, and played by the agent's rollout turn by turn."""

from __future__ import annotations

import random

import pytest

from dataplane.records import TrajectoryGroup
from dataplane.tasks import TaskAdapter, build_task, register_task
from dataplane.tasks.base import TASKS, Prompt
from dataplane.tasks.episodes import Episode
from worker_agent.engines.base import Completion, SamplingParams
from worker_agent.rollout import GroupLease, rollout_groups

AGAIN = "again\n"


class ByteEngine:
    """An engine over byte ids that answers every turn with ``ok`` (what rollout_episodes needs of an engine)."""

    def __init__(self) -> None:
        self.turn_calls = 0

    def tokenizer(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": list(text.encode())}

    def encode_prompt(self, prompt: str) -> list[int]:
        return [0, *prompt.encode()]

    def generate_ids(self, contexts, *, n, params, stop=None):
        self.turn_calls += 1
        return [(Completion(prompt_ids=c, completion_ids=list(b"ok"), logprobs=[-0.5, -0.25], text="ok"),)
                for c in contexts]


@pytest.fixture
def two_turns():
    """A toy multi-turn task: the environment asks once more; the return counts the turns that said ``ok``."""

    @register_task
    class TwoTurns(TaskAdapter):
        name = "two-turns"
        multi_turn = True
        reward_range = (0.0, 2.0)

        def sample_prompts(self, rng: random.Random, count: int) -> list[Prompt]:
            return [Prompt(f"say ok {rng.randrange(10)}\n") for _ in range(count)]

        def reward(self, prompt: str, completion: str) -> float:
            return float(sum(turn == "ok" for turn in completion.split(AGAIN)))

        def play(self, prompts, *, generate, encode, prompt_ids=None):
            episodes = [Episode(prompt=p, prompt_ids=ids, messages=[]) for p, ids in zip(prompts, prompt_ids,
                                                                                         strict=True)]
            for turn_index in range(2):
                for episode, turn in zip(episodes, generate([e.prompt_ids + e.completion_ids for e in episodes]),
                                         strict=True):
                    reply = encode(AGAIN) if turn_index == 0 else []
                    episode.completion_ids += turn.ids + reply
                    episode.logprobs += turn.logprobs + [0.0] * len(reply)
                    episode.loss_mask += [1] * len(turn.ids) + [0] * len(reply)
                    episode.text += turn.text + (AGAIN if reply else "")
                    episode.turns += 1
            for episode in episodes:
                episode.reward = self.reward(episode.prompt, episode.text)
            return episodes

    yield TwoTurns
    TASKS.pop("two-turns", None)


def test_a_multi_turn_task_registered_here_is_played_by_the_rollout(two_turns) -> None:
    task, engine = build_task({"name": "two-turns"}), ByteEngine()
    assert isinstance(task, two_turns)
    leases = [GroupLease(f"{i}-0", f"g{i}", p.text) for i, p in enumerate(task.sample_prompts(random.Random(0), 2))]

    groups = rollout_groups(engine, task, leases, job_id=1, n=3, params=SamplingParams(max_new_tokens=2), version=5)

    assert engine.turn_calls == 2  # one engine call per turn, for all six episodes
    for lease, group in zip(leases, groups, strict=True):
        group = TrajectoryGroup.model_validate_json(group.model_dump_json())  # as the site parses it
        group.check_for_job(job_id=1, group_size=3, max_version=5)
        for record in group.records:
            assert (record.lease_id, record.prompt, record.version) == (lease.lease_id, lease.prompt, 5)
            assert record.completion == "ok" + AGAIN + "ok" and record.reward == 2.0
            assert record.loss_mask == [1, 1] + [0] * len(AGAIN) + [1, 1]  # the environment's reply does not learn
            assert record.metadata == {"turns": 2}
