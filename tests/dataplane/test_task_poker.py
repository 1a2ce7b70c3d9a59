"""Heads-up hold'em on PokerKit for the sandbox task (dataplane/tasks/poker.py), driven by scripted players (no
model): hands replay from their prompt, masks cover the assistant's tokens, illegal answers fold, self-play is
zero-sum; with the answer's opener written by the environment (``answer_prefix``) as without."""

from __future__ import annotations

import random
import re

import pytest

from dataplane.tasks import TaskSpecError, build_task
from dataplane.tasks.episodes import Turn

pytest.importorskip("pokerkit")


def poker(**options):
    return build_task({"name": "sandbox", "env": "poker", **options})


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def player(style: str = "mixed"):
    """A scripted policy over the message it reads (the last one in its context): deterministic, so two workers
    given the same hand play it the same way, and it often bets, so hands last several decisions."""

    def answer(message: str) -> str:
        options = re.findall(r"<answer>([^<]*)</answer>", re.search(r"Your options: (.*)\n", message)[1])
        span = re.search(r"<answer>(bet|raise) (\d+)</answer> \(or", message)
        cards = re.findall(r"Your cards: (\S\S) (\S\S)", message)[-1]
        if style == "illegal":
            return "<answer>raise 99999</answer>"
        if span and cards[0][0] == cards[1][0]:
            return f"<answer>{span[1]} {int(span[2]) + 2}</answer>"
        if style == "mixed" and sum(map(ord, message)) % 4 == 0:
            return "<answer>fold</answer>" if "fold" in options else "<answer>check</answer>"
        call = next((o for o in options if o in ("call", "check")), options[0])
        return f"<answer>{call}</answer>"

    def generate(contexts: list[list[int]]) -> list[Turn]:
        turns = []
        for ids in contexts:
            text = answer(decode(ids).rsplit("Actions: ", 1)[-1] if "Actions: " in decode(ids) else decode(ids))
            if decode(ids).endswith("<answer>"):  # the environment opened the answer: the turn goes on from there
                text = text.removeprefix("<answer>")
            turns.append(Turn(ids=encode(text), logprobs=[-0.5] * len(text), text=text))
        return turns

    return generate


def hands(task, count: int, seed: int = 0) -> list[str]:
    return [p.text for p in task.sample_prompts(random.Random(seed), count)]


@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("opponent", ["heuristic", "random", "self"])
def test_a_hand_replays_from_its_prompt_on_any_worker_and_in_the_audit(opponent, prefix) -> None:
    prompts = hands(poker(opponent=opponent, answer_prefix=prefix), 30)
    worker_a = poker(opponent=opponent, answer_prefix=prefix).play(prompts, generate=player(), encode=encode)
    worker_b = poker(opponent=opponent, answer_prefix=prefix).play(prompts, generate=player(), encode=encode)
    audit = poker(opponent=opponent, answer_prefix=prefix)  # the learner's copy: the prompt and the transcript only
    assert [e.text for e in worker_a] == [e.text for e in worker_b]
    assert [e.reward for e in worker_a] == [e.reward for e in worker_b]
    assert [audit.reward(e.prompt, e.text) for e in worker_a] == [e.reward for e in worker_a]
    assert max(e.info["decisions"] for e in worker_a) >= 3  # hands went past one decision
    assert len({e.reward for e in worker_a}) > 1
    # The transcript is checked, not trusted: a changed card, a changed result or a missing answer do not replay.
    long = max(worker_a, key=lambda e: e.info["decisions"])
    claimed = f"({long.reward:+g} big blinds)"
    assert claimed in long.text
    low = audit.game.return_range[0]
    assert audit.reward(long.prompt, long.text.replace(claimed, "(+99 big blinds)")) == low
    cut = long.text[:long.text.rfind("Actions: ")]
    assert audit.reward(long.prompt, cut) == low
    assert not any(e.info["illegal"] for e in worker_a)  # the scripted player answers legally, opener or not
    if prefix:  # a first turn without the environment's opener is not a transcript it wrote
        first = next(e for e in worker_a if e.text.startswith("<answer>") and e.info["decisions"] >= 2)
        assert audit.reward(first.prompt, first.text.removeprefix("<answer>")) == low


def test_the_deal_comes_from_the_seed_in_the_prompt() -> None:
    task = poker()
    prompt = hands(task, 1, seed=7)[0]
    assert re.search(r"Hand \d+: heads-up no-limit hold'em, blinds 1/2, stacks 200\. You are the", prompt)
    assert hands(poker(), 1, seed=7)[0] == prompt  # another machine deals the same cards
    other_seed = re.sub(r"Hand (\d+)", lambda m: f"Hand {int(m[1]) + 1}", prompt)
    assert task.start(other_seed) is None  # the cards shown are not that seed's
    assert task.start(prompt) is not None
    assert poker(stack=100).start(prompt) is None  # nor the job's stacks


def test_masks_cover_exactly_the_assistant_tokens() -> None:
    task = poker(opponent="random", answer_prefix=False)
    prompts = hands(task, 12, seed=3)
    sampled: list[list[int]] = []

    def generate(contexts):
        turns = player()(contexts)
        sampled.extend(t.ids for t in turns)
        return turns

    episodes = task.play(prompts, generate=generate, encode=encode)
    for ep in episodes:
        record = ep.record(job_id=1, lease_id="l", group_id="g", version=0)
        assert len(record.loss_mask) == len(record.completion_ids) == len(record.logprobs)
        learned = [i for i, m in zip(record.completion_ids, record.loss_mask, strict=True) if m]
        turns = "".join(m["content"] for m in ep.messages if m["role"] == "assistant")
        assert decode(learned) == turns  # every assistant token, and nothing else
        env = decode([i for i, m in zip(record.completion_ids, record.loss_mask, strict=True) if not m])
        assert env == "".join(f"\n{m['content']}\n" for m in ep.messages[2:] if m["role"] == "user")
        assert all(lp == 0.0 for lp, m in zip(record.logprobs, record.loss_mask, strict=True) if not m)
        assert record.metadata["turns"] == ep.turns == record.metadata["decisions"]
        assert record.metadata["seat"] in (0, 1) and f"Hand {record.metadata['hand']}:" in ep.prompt
    assert sum(len(t) for t in sampled) == sum(sum(e.loss_mask) for e in episodes)
    assert episodes[0].messages[-1]["content"].startswith("Actions: ")  # the hand's end closes every transcript


def test_the_answers_opener_is_the_environments_text_and_the_policys_tokens_follow_it() -> None:
    """With ``answer_prefix`` every assistant turn starts after ``<answer>``, written by the environment: at the
    start of the completion when the agent acts first, at the end of every decision point's message otherwise.
    Those tokens have loss mask 0; the tokens after them are exactly what the policy sampled (mask 1)."""
    task = poker(opponent="random", answer_prefix=True)
    prompts = hands(task, 12, seed=3)
    sampled: list[list[int]] = []

    def generate(contexts):
        assert all(decode(c).endswith("<answer>") for c in contexts)  # every turn opens after the opener
        turns = player()(contexts)
        sampled.extend(t.ids for t in turns)
        return turns

    episodes = task.play(prompts, generate=generate, encode=encode)
    assert sum(len(t) for t in sampled) == sum(sum(e.loss_mask) for e in episodes)
    for ep in episodes:
        record = ep.record(job_id=1, lease_id="l", group_id="g", version=0)
        assert len(record.loss_mask) == len(record.completion_ids) == len(record.logprobs)
        runs, before = [], []  # each run of the policy's tokens, and the environment's text just before it
        for k, (i, m) in enumerate(zip(record.completion_ids, record.loss_mask, strict=True)):
            if m and (k == 0 or not record.loss_mask[k - 1]):
                runs.append([])
                before.append(decode(record.completion_ids[:k]))
            if m:
                runs[-1].append(i)
        turns = [m["content"] for m in ep.messages if m["role"] == "assistant"]
        assert [decode(r) for r in runs] == [t.removeprefix("<answer>") for t in turns]
        assert all(t.startswith("<answer>") for t in turns)  # the conversation's answers are whole
        assert all(b.endswith("<answer>") for b in before)
        assert all(lp == 0.0 for lp, m in zip(record.logprobs, record.loss_mask, strict=True) if not m)
        assert record.completion.startswith("<answer>") == ("The opponent acts first" not in ep.prompt)
        assert not record.completion.endswith("<answer>")  # the hand's end is answered by nobody
        assert task.reward(ep.prompt, record.completion) == ep.reward


def test_a_chatml_job_opens_the_answer_by_default() -> None:
    chat = poker(turn_format="chatml")
    assert chat.spec()["answer_prefix"] is True and poker().spec()["answer_prefix"] is False
    assert poker(turn_format="chatml", answer_prefix=False).spec()["answer_prefix"] is False
    raw, text = chat.game.reply("Actions: none yet.", answers=True)
    assert raw.endswith("<|im_start|>assistant\n<answer>") and text.endswith("\nassistant\n<answer>")
    assert not chat.game.reply("Hand over.", answers=False)[0].endswith("<answer>")


@pytest.mark.parametrize(("turn", "legal"), [
    ("call</answer>", True), ("call", True), (" call \nmore words", True), ("<answer>call</answer>", False),
    ("call it</answer>", False), ("I call.", False), ("\ncall</answer>", False), ("raise N</answer>", False)])
def test_with_the_opener_the_answer_is_the_text_up_to_the_closer_or_the_lines_end(turn, legal) -> None:
    task = poker(opponent="heuristic", answer_prefix=True)
    button = next(p for p in hands(task, 20) if "You are the button" in p)  # first to act, facing the big blind

    def generate(contexts):
        return [Turn(ids=encode(turn), logprobs=[-1.0] * len(turn), text=turn) for _ in contexts]

    episode, = task.play([button], generate=generate, encode=encode)
    assert ("Actions: preflop: you call 1" in episode.text) == legal  # the first answer, read or folded
    if not legal:
        assert "Actions: preflop: you fold." in episode.text and episode.info == {**episode.info, "illegal": 1,
                                                                                 "decisions": 1}
    assert task.reward(button, episode.text) == episode.reward


@pytest.mark.parametrize("penalty", [0, 1.5])
@pytest.mark.parametrize("answer", ["<answer>raise 99999</answer>", "<answer>shove</answer>", "I call.",
                                    "<answer>bet 1</answer>", "<answer>check 3</answer>"])
def test_an_illegal_answer_folds_and_is_counted(answer, penalty) -> None:
    task = poker(opponent="heuristic", answer_prefix=False, illegal_penalty=penalty)
    button = next(p for p in hands(task, 20) if "You are the button" in p)  # first to act, facing the big blind

    def generate(contexts):
        return [Turn(ids=encode(answer), logprobs=[-1.0] * len(answer), text=answer) for _ in contexts]

    episode, = task.play([button], generate=generate, encode=encode)
    assert episode.reward == -0.5 - penalty  # the small blind, lost, and the penalty
    assert episode.info["illegal"] == 1 and episode.info["decisions"] == 1
    assert "Actions: preflop: you fold." in episode.text
    assert task.reward(button, episode.text) == -0.5 - penalty  # the learner's audit replays the same return


def test_the_illegal_answer_penalty_ranks_it_below_the_legal_fold_and_leaves_legal_play_alone() -> None:
    plain, penalized = poker(opponent="heuristic"), poker(opponent="heuristic", illegal_penalty=1.0)
    prompts = hands(plain, 24, seed=3)
    fold = "<answer>fold</answer>"

    def folder(contexts):  # folds where it may, else checks: always legal
        texts = [fold if "<answer>fold</answer>" in decode(c).rsplit("Your options:", 1)[-1] else
                 "<answer>check</answer>" for c in contexts]
        return [Turn(encode(t), [-1.0] * len(t), t) for t in texts]

    for policy in (player(), folder):
        legal = [(e.reward, e.info["illegal"]) for e in plain.play(prompts, generate=policy, encode=encode)]
        assert legal == [(e.reward, e.info["illegal"]) for e in penalized.play(prompts, generate=policy, encode=encode)]
        assert all(illegal == 0 for _, illegal in legal)
    button = next(p for p in prompts if "You are the button" in p)
    legal_fold, = penalized.play([button], generate=folder, encode=encode)
    illegal, = penalized.play([button], generate=player("illegal"), encode=encode)
    assert (legal_fold.reward, illegal.reward) == (-0.5, -1.5)
    assert penalized.reward_range == (-101.0, 100.0)


@pytest.mark.parametrize("prefix", [False, True])
def test_self_play_returns_are_zero_sum_across_seats(prefix) -> None:
    task = poker(opponent="self", answer_prefix=prefix)
    prompts = hands(task, 40, seed=11)
    episodes = task.play(prompts, generate=player(), encode=encode)
    assert all(e.reward + e.info["opponent_return"] == 0 for e in episodes)
    assert any(e.reward for e in episodes)
    # The same deal from the other seat, with the same deterministic policy in both seats, is the same hand.
    seed_of = {int(re.search(r"Hand (\d+)", p)[1]): p for p in prompts}
    swapped = []
    for seed, prompt in seed_of.items():
        seat = 0 if "You are the button" in prompt else 1
        swapped.append((seed, seat))
    starts = [task.game.first_message(task.game.deal(seed, seat)) for seed, seat in swapped]
    others = task.play([task.render_prompt(task.first_messages(s)) for s in starts], generate=player(), encode=encode)
    assert sorted(e.reward for e in others) == sorted(-e.reward for e in episodes)


def test_fixed_limit_bets_are_the_fixed_size() -> None:
    task = poker(limit="fixed-limit", blinds=[1, 2], stack=40, opponent="random")
    button = next(p for p in hands(task, 20) if "You are the button" in p)
    options = "Your options: <answer>fold</answer> or <answer>call</answer> (1 more) or <answer>raise 4</answer>."
    assert options in button  # one size: no N to choose

    def generate(contexts):  # raise without an amount (there is one size), then call or check down
        texts = [("<answer>call</answer>" if "<answer>call" in decode(c)[-200:] else "<answer>check</answer>")
                 if "you raise to 4" in decode(c) else "<answer>raise</answer>" for c in contexts]
        return [Turn(encode(t), [-1.0] * len(t), t) for t in texts]

    episode, = task.play([button], generate=generate, encode=encode)
    assert episode.info["illegal"] == 0 and "preflop: you raise to 4" in episode.text


def test_bad_options_are_refused_naming_the_option() -> None:
    with pytest.raises(TaskSpecError, match="^limit: must be one of no-limit, fixed-limit"):
        poker(limit="pot-limit")
    with pytest.raises(TaskSpecError, match="^opponent: "):
        poker(opponent="gto")
    with pytest.raises(TaskSpecError, match="^blinds: "):
        poker(blinds=[2])
    with pytest.raises(TaskSpecError, match="^stack: must be an integer between 4 and 2000"):
        poker(stack=3)
    with pytest.raises(TaskSpecError, match="^answer_prefix: must be true or false"):
        poker(answer_prefix="yes")
    with pytest.raises(TaskSpecError, match="^illegal_penalty: must be a number of big blinds between 0 and the "
                                            "stack's 100"):
        poker(illegal_penalty=-1)
    with pytest.raises(TaskSpecError, match="^env: unknown environment 'chess'; available: nim, poker"):
        build_task({"name": "sandbox", "env": "chess"})
    spec = poker().spec()
    assert spec == {"name": "sandbox", "env": "poker", "max_turns": 10, "limit": "no-limit", "blinds": [1, 2],
                    "stack": 200, "opponent": "heuristic", "turn_format": "plain", "answer_prefix": False,
                    "illegal_penalty": 0.0}
    assert build_task(spec).spec() == spec
    assert poker().reward_range == (-100.0, 100.0)
