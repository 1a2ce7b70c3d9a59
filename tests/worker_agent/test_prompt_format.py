"""The job's prompt format reaches the agent's engine with the assignment: a chat job's records carry the ids of
the chat template with the job's system prompt (dataplane/chat.py), a plain job's the tokenizer's own."""

from __future__ import annotations

import asyncio
import shutil

from dataplane import messages as m
from dataplane.chat import PromptFormat, prompt_ids

from .test_session import answering, assign, learner_side, make_session, push, returned, snapshot, submits, until

__all__ = ["learner_side"]  # the fixture, used here as test_session uses it

TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}={% endfor %}"


def test_a_chat_jobs_records_carry_its_chat_prompt_ids(tmp_path, learner_side, tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    store, server = learner_side
    model_dir = tmp_path / "chat-model"
    shutil.copytree(tiny_model_dir, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(model_dir)
    base = store.write_base(model_dir)
    fmt = PromptFormat(chat=True, system_prompt="4")

    async def scenario() -> None:
        session, socket = make_session(tmp_path, [])
        job = assign(1, snapshot(store, server, base), digest=base.sha256).model_copy(update={"prompt_format": fmt})
        await push(session, job)
        await until(lambda: submits(socket), "a lease request once the base is in")
        lease = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l1", group_id="g1", prompt="1+2=")])
        await push(session, answering(socket, lease))
        await until(lambda: returned(socket), "a generated group")
        session._stop_rollout()
        return returned(socket)[0]["records"]

    records = asyncio.run(scenario())
    wanted = prompt_ids(tokenizer, "1+2=", fmt)
    assert tokenizer.decode(wanted) == "<s>4=1+2=="  # the system prompt, then the user's message
    assert all(r["prompt_ids"] == wanted for r in records)
