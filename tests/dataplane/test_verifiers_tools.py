"""verifiers environments that answer with a tool's result (dataplane/tasks/verifiers_env.py): the reply keeps its
``tool`` role in the conversation the rubric scores, a ``chatml`` job writes it as a ChatML turn of that role in the
tokens (never trained on), the learner's replay of the transcript gives the live reward, and a tiny chat model
plays such episodes through the agent's rollout and trains a step on them."""

from __future__ import annotations

import random
import string

import pytest

from dataplane.tasks import build_task
from dataplane.tasks.episodes import Turn
from dataplane.tasks.verifiers_env import ALLOW_USER_CODE
from tests.tiny_chat import tiny_chatml_model

vf = pytest.importorskip("verifiers.v1")


class CalcData(vf.TaskData):
    answer: str


class CalcTask(vf.Task[CalcData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        return float(trace.last_reply.strip() == task.answer)

    @vf.reward(weight=0.5)
    async def used_the_tool(self, trace) -> float:
        return float(bool(trace.tool_messages))


class Calculator(vf.Taskset):
    """Products the model may hand to a calculator: its first turn is the call, the tool answers once."""

    def load(self):
        for a in range(2, 6):
            yield CalcTask(CalcData(prompt=f"{a}*4=", answer=str(4 * a), system_prompt="Call calc, then answer."))

    def env_response(self, messages, task):
        if any(m["role"] == "tool" for m in messages):
            return None  # it answered once: the next turn is the last
        a, b = task.data.prompt.rstrip("=").split("*")
        return {"role": "tool", "content": str(int(a) * int(b)), "tool_call_id": "call_1", "name": "calc"}


def load_environment():
    return Calculator(vf.TasksetConfig())


SPEC = {"name": "verifiers", "env": "tests.dataplane.test_verifiers_tools:load_environment", "max_turns": 2,
        "reward_range": [0, 1.5]}
ALPHABET = string.ascii_letters + string.digits + " *=,.\n"


@pytest.fixture(autouse=True)
def allowed(monkeypatch):
    monkeypatch.setenv(ALLOW_USER_CODE, "1")


def scripted(*texts: str, encode):
    turns = iter(texts)

    def generate(contexts):
        text = next(turns)
        return [Turn(ids=encode(text), logprobs=[-0.5] * len(encode(text)), text=text) for _ in contexts]
    return generate


def test_a_tools_reply_keeps_its_role_through_the_episode_the_rubric_and_the_replay() -> None:
    task = build_task(SPEC)
    prompt = next(p.text for p in task.sample_prompts(random.Random(0), 20) if "3*4=" in p.text)
    encode = lambda s: [ord(c) for c in s]  # noqa: E731

    (episode,) = task.play([prompt], generate=scripted("CALL calc 3*4", "12", encode=encode), encode=encode)

    assert [m["role"] for m in episode.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert episode.messages[3] == {"role": "tool", "content": "12", "tool_call_id": "call_1", "name": "calc"}
    assert episode.reward == 1.5  # right, and the rubric saw the tool's message in its trace
    assert episode.text == "CALL calc 3*4\n12\n12"  # plain: the reply's text between newlines, its role unwritten
    assert episode.loss_mask == [1] * 13 + [0] * 4 + [1] * 2
    assert task.reward(prompt, episode.text) == 1.5  # the learner's audit replays the transcript
    assert task.reward(prompt, "12") == 1.0  # answered without the tool: no reply in the transcript


def test_a_chatml_job_writes_the_reply_as_a_tool_turn_in_the_tokens() -> None:
    pytest.importorskip("transformers")
    from learner.tiny import build_tokenizer

    tokenizer = build_tokenizer(ALPHABET)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    encode = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    task = build_task({**SPEC, "turn_format": "chatml"})
    prompt = next(p.text for p in task.sample_prompts(random.Random(0), 20) if "5*4=" in p.text)

    (episode,) = task.play([prompt], generate=scripted("CALL calc 5*4", "20", encode=encode), encode=encode)

    reply = [i for i, m in zip(episode.completion_ids, episode.loss_mask, strict=True) if m == 0]
    assert tokenizer.decode(reply) == "<|im_end|>\n<|im_start|>tool\n20<|im_end|>\n<|im_start|>assistant\n"
    # what the record's text is: its ids decoded as the learner's audit decodes them, special tokens skipped
    assert episode.text == tokenizer.decode(episode.completion_ids, skip_special_tokens=True)
    assert episode.reward == 1.5 and task.reward(prompt, episode.text) == 1.5
    assert build_task(task.spec()).spec()["turn_format"] == "chatml"


def test_a_tiny_chat_model_plays_tool_episodes_and_trains_a_step_on_them(tmp_path) -> None:
    pytest.importorskip("transformers")
    import torch
    from transformers import LlamaForCausalLM

    from dataplane.chat import PromptFormat
    from dataplane.jobs import LossConfig
    from dataplane.packed import pack_records
    from learner.batch import concat
    from learner.step import PolicyTrainer
    from worker_agent.engines.base import SamplingParams
    from worker_agent.engines.hf import HFEngine
    from worker_agent.rollout import GroupLease, rollout_groups

    tokenizer = tiny_chatml_model(tmp_path, ALPHABET)
    task = build_task({**SPEC, "turn_format": "chatml"})
    chat = PromptFormat(chat=True)
    engine = HFEngine(str(tmp_path), device="cpu", seed=0, prompt_format=chat)
    leases = [GroupLease(f"l{i}", f"g{i}", p.text) for i, p in enumerate(task.sample_prompts(random.Random(1), 2))]

    groups = rollout_groups(engine, task, leases, job_id=1, n=4, version=0,
                            params=SamplingParams(max_new_tokens=4, temperature=1.0))

    records = [r for g in groups for r in g.records]
    assert len(records) == 8
    for r in records:
        assert r.metadata["turns"] == 2  # the call, the tool's answer, the last turn
        assert "<|im_start|>tool\n" in tokenizer.decode(r.completion_ids)  # the tool's turn, in ChatML
        assert task.reward(r.prompt, r.completion) == r.reward  # the learner's replay
        assert r.reward >= 0.5  # the rubric saw the tool's message
    model = LlamaForCausalLM.from_pretrained(tmp_path)
    trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                            LossConfig().resolved(clip_eps=0.2, max_new_tokens=4), pad_id=tokenizer.pad_token_id)
    stats = trainer.step(concat(pack_records(g.records) for g in groups))
    assert stats.reward_mean == pytest.approx(sum(r.reward for r in records) / len(records))
