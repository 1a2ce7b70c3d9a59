"""The verifiers task: a verifiers (v1) environment built here -- a local taskset, a rubric, an env_response --
scored by its own rubric, single- and multi-turn, loaded only where user code is allowed."""

from __future__ import annotations

import asyncio
import random

import pytest

from dataplane.chat import encode_chat, prompt_text
from dataplane.tasks import TaskSpecError, build_task
from dataplane.tasks.episodes import Turn
from dataplane.tasks.verifiers_env import ALLOW_USER_CODE, UserCodeRefused


def prompt(a: int) -> str:
    """The prompt of the task "a+1=" with its system prompt: the chat, as it travels (dataplane.chat.encode_chat)."""
    return encode_chat([{"role": "system", "content": "Add."}, {"role": "user", "content": f"{a}+1="}])

vf = pytest.importorskip("verifiers.v1")
HERE = "tests.dataplane.test_task_verifiers"


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        return float(trace.last_reply.strip() == task.answer)

    @vf.reward(weight=0.5)
    async def polite(self, trace) -> float:  # scores every assistant turn of the conversation
        return float(all("!" not in (m.content or "") for m in trace.assistant_messages))


class Sums(vf.Taskset):
    def __init__(self, config, *, top: int) -> None:
        super().__init__(config)
        self.top = top

    def load(self):
        for a in range(self.top):
            yield SumTask(SumData(prompt=f"{a}+1=", answer=str(a + 1), system_prompt="Add."))


class Guess(Sums):
    """Guess the answer; a wrong guess is told "higher" or "lower"."""

    def env_response(self, messages, task):
        guess = messages[-1]["content"].strip()
        if guess == task.data.answer or not guess.isdigit():
            return None
        return "higher" if int(guess) < int(task.data.answer) else "lower"


def load_environment(top: int = 5, multi_turn: bool = False):
    return (Guess if multi_turn else Sums)(vf.TasksetConfig(), top=top)


def load_broken():
    raise RuntimeError("no such table")


SINGLE = {"name": "verifiers", "env": f"{HERE}:load_environment", "args": {"top": 5},
          "reward_range": [0, 1.5]}


@pytest.fixture
def allowed(monkeypatch):
    monkeypatch.setenv(ALLOW_USER_CODE, "1")


def test_single_turn_prompts_are_the_tasks_and_the_rubric_scores(allowed) -> None:
    task = build_task(SINGLE)
    prompts = {p.text for p in task.sample_prompts(random.Random(0), 50)}

    assert prompts == {prompt(a) for a in range(5)} and not task.multi_turn
    # the system prompt kept as a turn of its own: a chat job's template renders it, a plain job reads its lines
    assert prompt_text(None, prompt(2)) == "Add.\n2+1=\n"
    assert set(prompt_text(None, prompt(2))) <= set(task.alphabet)
    assert task.reward(prompt(2), " 3\n") == 1.5  # correct (1) + polite (0.5)
    assert task.reward(prompt(2), "3!") == 0.0  # neither right nor polite
    assert task.reward(prompt(2), "4") == 0.5
    assert task.reward(prompt(9), "10") == 0.0  # not one of its prompts
    assert build_task(task.spec()).spec() == task.spec()


def test_scoring_works_inside_an_agents_event_loop(allowed) -> None:
    async def in_loop() -> float:
        return build_task(SINGLE).reward(prompt(0), "1")

    assert asyncio.run(in_loop()) == 1.5


def test_multi_turn_plays_against_env_response_with_the_turn_aware_mask(allowed) -> None:
    task = build_task({**SINGLE, "args": {"top": 5, "multi_turn": True}, "max_turns": 3})
    guesses = iter(["1", "9", "4"])  # 3+1=4: lower-than, higher-than, right

    def generate(contexts):
        text = next(guesses)
        return [Turn(ids=[ord(c) for c in text], logprobs=[-0.5] * len(text), text=text) for _ in contexts]

    (episode,) = task.play([prompt(3)], generate=generate, encode=lambda s: [ord(c) for c in s])

    assert task.multi_turn and episode.turns == 3 and episode.reward == 1.5
    assert episode.text == "1\nhigher\n9\nlower\n4"
    assert episode.loss_mask == [1] + [0] * 8 + [1] + [0] * 7 + [1]
    assert episode.logprobs.count(0.0) == 15 and len(episode.completion_ids) == len(episode.loss_mask)
    assert task.reward(episode.prompt, episode.text) == episode.reward  # the learner's audit replays it
    assert task.reward(episode.prompt, "1\nhigher\n9") == 0.5  # out of turns before the right answer


def test_without_the_providers_opt_in_the_environment_is_never_imported(monkeypatch) -> None:
    monkeypatch.delenv(ALLOW_USER_CODE, raising=False)
    task = build_task({**SINGLE, "env": "tests.dataplane.no_such_module:load"})  # the site: nothing imported

    with pytest.raises(UserCodeRefused, match=r"^env: runs the job's own code .*--allow-user-code"):
        task.sample_prompts(random.Random(0), 1)
    with pytest.raises(UserCodeRefused):  # an agent whose provider did not opt in: it refuses the job
        task.prepare(allow_user_code=False)


def test_prepare_with_the_opt_in_loads_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(ALLOW_USER_CODE, raising=False)
    task = build_task(SINGLE)
    task.prepare(allow_user_code=True)  # the learner; an agent run with --allow-user-code

    assert task.reward(prompt(4), "5") == 1.5


@pytest.mark.parametrize(("options", "field"), [
    ({"env": "not a reference"}, "env"), ({"args": [1]}, "args"), ({"size": 0}, "size"),
    ({"max_turns": 101}, "max_turns"), ({"reward_range": [1, 0]}, "reward_range"),
])
def test_a_bad_spec_names_the_field(options, field) -> None:
    with pytest.raises(TaskSpecError, match=f"^{field}: "):
        build_task({**SINGLE, **options})


@pytest.mark.parametrize(("options", "message"), [
    ({"env": f"{HERE}:load_broken", "args": {}}, "env: cannot load .*RuntimeError: no such table"),
    ({"args": {"colour": 1}}, "env: cannot load .*colour"),
    ({"max_turns": 2}, "max_turns: more than 1 needs the environment's env_response"),
])
def test_a_bad_environment_is_a_clear_error_on_first_use(allowed, options, message) -> None:
    with pytest.raises(TaskSpecError, match=message):
        build_task({**SINGLE, **options}).sample_prompts(random.Random(0), 1)


def test_a_chat_job_renders_the_system_prompt_as_its_own_turn() -> None:
    pytest.importorskip("transformers")
    from dataplane.chat import PromptFormat
    from learner.tiny import build_tokenizer

    tokenizer = build_tokenizer("Add.+=0123456789")
    tokenizer.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    assert prompt_text(tokenizer, prompt(2), PromptFormat(chat=True)) == "[system]Add.[user]2+1="
    assert prompt_text(tokenizer, "2+1=", PromptFormat(chat=True)) == "[user]2+1="  # a lone user message
