"""The multi-turn sandbox task, driven by scripted policies (no model): returns, turn-aware masks, records."""

from __future__ import annotations

import random
import re

import pytest

from dataplane.records import Trajectory
from dataplane.tasks import TaskSpecError, available_tasks, build_task
from dataplane.tasks.sandbox import SandboxTask, Turn, render_reply, run_episode, run_episodes

TURN_LOGPROB = -0.25


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def stones_left(context: list[int]) -> int:
    return int(re.findall(r"(?:There are|\.) (\d+) stones", decode(context))[-1])


def policy(move) -> callable:
    """A scripted engine: ``move(stones)`` gives the reply text of one assistant turn."""
    def generate(context: list[int]) -> Turn:
        text = move(stones_left(context))
        return Turn(ids=encode(text), logprobs=[TURN_LOGPROB] * len(text), text=text)
    return generate


optimal = policy(lambda stones: f"I leave a multiple of 4. <answer>{stones % 4}</answer>")
take_one = policy(lambda stones: "<answer>1</answer>")


@pytest.fixture
def task() -> SandboxTask:
    return build_task({"name": "sandbox", "env": "nim", "max_stones": 15, "max_take": 3})


def prompt_with(task: SandboxTask, stones: int) -> str:
    return task.render_prompt(task.first_messages(task.game.describe(stones)))


def test_optimal_play_wins_over_several_turns(task: SandboxTask) -> None:
    prompt = prompt_with(task, 14)

    episode = run_episode(task, prompt, generate=optimal, encode=encode)

    assert episode.reward == 1.0
    assert episode.turns == 4  # 14 -2 -1 = 11, -3 -1 = 7, -3 -1 = 3, -3 = 0
    assert [m["role"] for m in episode.messages] == ["system", "user"] + ["assistant", "user"] * 3 + ["assistant"]
    assert episode.messages[3]["content"] == "I took 1. 11 stones left. Your move."


def test_loss_mask_covers_exactly_the_assistant_tokens(task: SandboxTask) -> None:
    episode = run_episode(task, prompt_with(task, 14), generate=optimal, encode=encode)
    assistant = "".join(m["content"] for m in episode.messages if m["role"] == "assistant")
    replies = "".join(render_reply(m["content"]) for m in episode.messages[2:] if m["role"] == "user")

    n = len(episode.completion_ids)
    assert len(episode.loss_mask) == len(episode.logprobs) == n
    assert decode(episode.completion_ids) == episode.text
    assert decode([t for t, m in zip(episode.completion_ids, episode.loss_mask, strict=True) if m == 1]) == assistant
    assert decode([t for t, m in zip(episode.completion_ids, episode.loss_mask, strict=True) if m == 0]) == replies
    assert episode.loss_mask[0] == 1 and episode.loss_mask[-1] == 1  # starts and ends with the agent
    for lp, m in zip(episode.logprobs, episode.loss_mask, strict=True):
        assert lp == (TURN_LOGPROB if m else 0.0)  # only sampled tokens carry behaviour log-probs


def test_episode_becomes_a_valid_record(task: SandboxTask) -> None:
    prompt = prompt_with(task, 14)
    episode = run_episode(task, prompt, generate=optimal, encode=encode, prompt_ids=[1, *encode(prompt)])

    built = episode.record(job_id=5, lease_id="9-0", group_id="g", version=3)
    record = Trajectory.model_validate_json(built.model_dump_json())  # as the site parses it

    assert record.loss_mask == episode.loss_mask
    assert record.prompt_ids[0] == 1  # the engine's own prompt encoding (here with a BOS) is kept
    assert (record.reward, record.version, record.metadata) == (1.0, 3, {"turns": 4})


def test_reward_replays_the_transcript(task: SandboxTask) -> None:
    for stones in (5, 6, 7, 9, 14, 15):
        prompt = prompt_with(task, stones)
        for generate in (optimal, take_one):
            episode = run_episode(task, prompt, generate=generate, encode=encode)
            assert task.reward(prompt, episode.text) == episode.reward


def test_suboptimal_play_loses(task: SandboxTask) -> None:
    episode = run_episode(task, prompt_with(task, 14), generate=take_one, encode=encode)

    assert episode.reward == 0.0
    assert episode.turns == 4  # 14 -1 -1 =12, -1 -3 = 8, -1 -3 = 4, -1 -3 = 0: the opponent took the last stone


@pytest.mark.parametrize("turn", ["I take two", "<answer>two</answer>", "<answer>4</answer>", "<answer>0</answer>",
                                  "<answer>\n2</answer>", ""])
def test_malformed_or_illegal_move_forfeits_at_once(task: SandboxTask, turn: str) -> None:
    prompt = prompt_with(task, 14)

    episode = run_episode(task, prompt, generate=policy(lambda stones: turn), encode=encode)

    assert (episode.reward, episode.turns) == (0.0, 1)
    assert episode.loss_mask == [1] * len(turn)
    assert task.reward(prompt, episode.text) == 0.0


def test_only_the_first_answer_of_a_turn_is_the_move(task: SandboxTask) -> None:
    prompt = prompt_with(task, 3)

    assert task.reward(prompt, "<answer>3</answer>") == 1.0  # a single-turn completion can win at once
    assert task.reward(prompt, "<answer>1</answer><answer>3</answer>") == 0.0  # 3 -> 2, then the opponent takes 2
    assert task.reward(prompt_with(task, 14), "<answer>2</answer>") == 0.0  # unfinished: no reply, no return


def test_episode_stops_after_max_turns(task: SandboxTask) -> None:
    short = build_task({**task.spec(), "max_turns": 2})
    prompt = prompt_with(short, 14)

    episode = run_episode(short, prompt, generate=optimal, encode=encode)

    assert (episode.turns, episode.reward) == (2, 0.0)
    assert episode.text.endswith(render_reply("I took 1. 7 stones left. Your move."))
    assert short.reward(prompt, episode.text) == 0.0


def test_episodes_run_in_lockstep_batches(task: SandboxTask) -> None:
    prompts = [prompt_with(task, s) for s in (3, 14, 7)] + ["not a game prompt"]
    calls: list[int] = []

    def generate(contexts: list[list[int]]) -> list[Turn]:
        calls.append(len(contexts))
        return [optimal(c) for c in contexts]

    episodes = run_episodes(task, prompts, generate=generate, encode=encode)

    assert [e.turns for e in episodes] == [1, 4, 2, 0]
    assert [e.reward for e in episodes] == [1.0, 1.0, 1.0, 0.0]
    assert calls == [3, 2, 1, 1]  # only live episodes are sampled; the foreign prompt is never played


def test_sampled_prompts_are_winnable_starts_in_the_alphabet(task: SandboxTask) -> None:
    prompts = task.sample_prompts(random.Random(0), 200)

    assert task.sample_prompts(random.Random(0), 200) == prompts
    for p in prompts:
        state = task.start(p.text)
        assert state is not None and 2 <= state.stones <= 15 and state.stones % 4 != 0
        episode = run_episode(task, p.text, generate=optimal, encode=encode)
        assert episode.reward == 1.0
        replies = decode([t for t, m in zip(episode.completion_ids, episode.loss_mask, strict=True) if m == 0])
        assert set(p.text) | set(replies) <= set(task.alphabet)  # a tiny tokenizer covers prompts and replies


def test_foreign_prompt_scores_zero(task: SandboxTask) -> None:
    assert task.reward("3+4=", "<answer>3</answer>") == 0.0
    assert task.reward(prompt_with(task, 99), "<answer>3</answer>") == 0.0  # more stones than this task draws
    other = build_task({"name": "sandbox", "max_take": 2})
    assert task.reward(prompt_with(other, 2), "<answer>2</answer>") == 0.0  # another game's rules


def test_spec_round_trips_and_registry_switches_by_config(task: SandboxTask) -> None:
    assert task.spec() == {"name": "sandbox", "env": "nim", "max_turns": 10, "max_stones": 15, "max_take": 3}
    assert build_task(task.spec()).spec() == task.spec()
    assert available_tasks()["sandbox"] is SandboxTask


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"env": "chess"}, "env"),
        ({"env": 3}, "env"),
        ({"max_turns": 0}, "max_turns"),
        ({"max_turns": "5"}, "max_turns"),
        ({"max_take": 0}, "max_take"),
        ({"max_take": 10}, "max_take"),
        ({"max_stones": 4}, "max_stones"),  # fewer than max_take+2: no winnable start
        ({"max_stones": 2.5}, "max_stones"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_bad_option_is_refused_naming_it(options: dict, option: str) -> None:
    with pytest.raises(TaskSpecError) as err:
        build_task({"name": "sandbox", **options})

    assert option in str(err.value)
